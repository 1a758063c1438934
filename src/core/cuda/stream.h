// cudaStream_t without the CUDA headers: an op's header (descriptor, launcher, `_ref` twin) is included
// by the CPU build too, which must never need CUDA. The declaration is the one the runtime makes.
#pragma once

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

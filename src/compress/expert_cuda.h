// The GPU half of an expert's task around its solver (compress --device cuda; CompressOptions::
// expert_device): the calibration rows X uploaded once and the original expert's outputs Y computed
// on the device (3xTF32 GEMMs, gpu::sgemm_3xtf32: fp32-class accuracy, + ops/swiglu_train, no
// activation quant), shared by the GPU SGPTQ and the GPU refinement through DeviceRows, then the W4A4
// reconstruction error of the compressed expert measured on those rows (ops/fake_quant per row,
// SwiGLU with Q_a, ops/weighted_mse in fp64). The CPU path computes the same quantities with cblas
// (pipeline.cpp); the values differ at the fp32 rounding level (summation order, the 3xTF32 split)
// only. Memory: the calling thread's scratch (compress/cuda_context.cuh), reused by its next expert.
// The same forward, over every expert of a layer, is the layer's propagation (layer_device_cuda). Defined in CUDA builds only (moesq_compress_cuda).
#pragma once
#include "compress/pipeline.h"

namespace moesq::compress {

// The GPU every compression stage uses from now on (the calling thread at once, each worker thread
// when it creates its context, compress/cuda_context.cuh): a rank's GPU, dist::gpu_for_local_rank.
// Call before the first GPU stage; the default is device 0. Error for an ordinal outside the visible
// devices.
void use_gpu(int ordinal);

// Errors (moesq::Error): a CUDA / cuBLAS failure naming the call; X holding a NaN or an infinity
// (rel_error).
const ExpertDevice* expert_device_cuda();

// The layer's GPU half (CompressOptions::layer_device), in the calling thread's context: the routing's
// input (compress/attention_cuda.h) and the propagation through the compressed routed experts (the
// routed part of DecoderModel::moe_block with the experts' W4A4 forward above). Errors: the
// launchers' and cuBLAS's; a non-finite output.
const LayerDevice* layer_device_cuda();

}  // namespace moesq::compress

// Programmatic dependent launch (PDL, Hopper sm_90+): a kernel launched with `launch_pdl` may start
// while the kernel before it on the stream is still running, so its launch latency and any prologue
// that reads only constant data (weights) overlap that kernel instead of following it. The CUDA
// programming guide, "Programmatic Dependent Launch and Synchronization"; PTX `griddepcontrol`.
//
// The contract, for every kernel launched with launch_pdl:
//   - it calls pdl_wait() before it reads or writes any memory that an earlier kernel of the stream
//     writes or reads (activations, counts, outputs, scratch) — only data no kernel writes (weights,
//     kernel parameters) may be touched before it. pdl_wait() returns once the previous grid has
//     completed and its memory is visible, so the order of the stream is kept;
//   - it calls pdl_launch_dependents() after pdl_wait() (here: right after it): the next kernel's CTAs
//     may then be scheduled (they sit in their own pdl_wait()), so at most two grids overlap and the
//     chain stays transitive (a kernel that has passed pdl_wait() knows every earlier grid completed).
// A kernel launched plainly may call both (they are no-ops then). Captured into a CUDA graph, a
// launch_pdl launch becomes a programmatic edge (CUDA 12.3+). Bits never change: PDL moves when a
// kernel starts, not what it computes. MOESQ_PDL=0 in the environment launches every kernel plainly
// (the same-run peer; bench/NOTES.md, session 28: B = 1 decode −12 % TPOT, +1 % at batch 64).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/cuda/check.cuh"
#include "core/env_switch.h"

namespace moesq {

// Blocks until the previous grid of the stream has completed and its writes are visible; returns at
// once for a kernel launched without the PDL attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next PDL-launched grid of the stream be scheduled (once every CTA of this grid has called it
// or exited).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Both, in the contract's order: the first statement of a kernel with no constant-data prologue.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}

// Asks L2 to fetch [p, p + bytes) (cp.async.bulk.prefetch.L2, sm_90+; a hint: no data moves to the
// CTA, nothing waits for it), split over the CTA's threads in 16 KB pieces. For the prologue before
// pdl_wait(): data no kernel writes (weights) starts streaming while the previous kernel finishes.
// p must be 16-byte aligned; bytes is rounded down to a multiple of 16.
__device__ __forceinline__ void prefetch_l2_range(const void* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr size_t kPiece = 16 * 1024;
  const char* base = static_cast<const char*>(p);
  const size_t stride = static_cast<size_t>(blockDim.x) * kPiece;
  for (size_t off = static_cast<size_t>(threadIdx.x) * kPiece; off < bytes; off += stride) {
    const size_t n = (bytes - off < kPiece ? bytes - off : kPiece) & ~static_cast<size_t>(15);
    if (n > 0)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(base + off), "r"(static_cast<unsigned>(n))
                   : "memory");
  }
#endif
}

// Asks L2 for the first `bytes` bytes from p, shared in 16 KB pieces by the grid's first `ctas` CTAs
// along x (blockIdx.y = z = 0; about one resident wave, so CTAs of later waves find their data in L2).
// A hint, as prefetch_l2_range; p 16-byte aligned; each piece rounded down to a multiple of 16.
__device__ __forceinline__ void prefetch_l2_grid(const void* p, int64_t bytes, int ctas) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int64_t kPiece = 16 * 1024;
  if (bytes <= 0 || blockIdx.y != 0 || blockIdx.z != 0 || blockIdx.x >= static_cast<unsigned>(ctas)) return;
  const int64_t n_ctas = gridDim.x < static_cast<unsigned>(ctas) ? gridDim.x : ctas;
  const int64_t pieces = (bytes + kPiece - 1) / kPiece;
  const char* base = static_cast<const char*>(p);
  for (int64_t q = blockIdx.x + n_ctas * threadIdx.x; q < pieces; q += n_ctas * blockDim.x) {
    const int64_t left = bytes - q * kPiece;
    const unsigned n = static_cast<unsigned>(left < kPiece ? left : kPiece) & ~15u;
    if (n > 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(base + q * kPiece), "r"(n) : "memory");
  }
#endif
}

// Whether launch_pdl sets the attribute: on, unless MOESQ_PDL=0 (read once per process).
inline bool pdl_enabled() {
  static const bool on = env_switch_on("MOESQ_PDL");
  return on;
}

// The largest forward (tokens) launched with PDL: MOESQ_PDL_MAX_TOKENS, default 16 (read once per
// process). PDL shortens a chain of small, latency-bound kernels; at prefill sizes it measured a cost
// (+4.7 % on a T = 512 MoE layer, +0.6 % TPOT at batch 64; bench/NOTES.md session 28), so a forward of
// more tokens launches plainly.
inline int64_t pdl_max_tokens() {
  static const int64_t n = env_int("MOESQ_PDL_MAX_TOKENS", 16, 0, INT64_MAX);
  return n;
}

namespace detail {
inline thread_local bool t_pdl_off = false;  // set by PdlTokensScope on this host thread
}

// For the scope's life, launch_pdl on this host thread sets the attribute only when the forward's
// token count T ≤ pdl_max_tokens(). A forward (engine step, MoE layer) opens one around its launches
// (and around a graph capture of them); scopes nest, the inner one decides.
class PdlTokensScope {
 public:
  explicit PdlTokensScope(int64_t T) : prev_(detail::t_pdl_off) { detail::t_pdl_off = T > pdl_max_tokens(); }
  ~PdlTokensScope() { detail::t_pdl_off = prev_; }
  PdlTokensScope(const PdlTokensScope&) = delete;
  PdlTokensScope& operator=(const PdlTokensScope&) = delete;

 private:
  bool prev_;
};

// kernel<<<grid, block, smem, stream>>>(args...) in thread-block clusters of `cluster` CTAs (sm_90+;
// each grid dimension a multiple of the cluster's; 1×1×1: no cluster attribute), with the
// programmatic-stream-serialization attribute (when pdl_enabled() and no PdlTokensScope of this thread
// turned it off). The kernel must keep the contract above. Errors: the launch's, as MOESQ_CUDA_CHECK
// (what names the kernel).
template <typename... Params, typename... Args>
void launch_pdl_cluster(const char* what, void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block, size_t smem,
                        cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled() && !detail::t_pdl_off) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x, attr[n].val.clusterDim.y = cluster.y, attr[n++].val.clusterDim.z = cluster.z;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
  cfg.attrs = attr, cfg.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  MOESQ_CHECK(err == cudaSuccess, what, ": launch failed: ", cudaGetErrorString(err));
}

// launch_pdl_cluster without clusters: the launcher of every PDL kernel.
template <typename... Params, typename... Args>
void launch_pdl(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  launch_pdl_cluster(what, kernel, grid, dim3(1, 1, 1), block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace moesq

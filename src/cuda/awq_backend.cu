// CUDA backend of the audit (see awq_backend.h). Non-obvious: the layer's elementwise stages stay on the
// host (moe::run_awq_moe_layer) so CPU and GPU runs differ ONLY in alignment order and GEMM arithmetic.
#include "cuda/awq_backend.h"

#include <algorithm>
#include <vector>

#include "cuda/awq_gemm.cuh"
#include "cuda/cuda_check.cuh"

namespace moesq::cuda {

namespace {

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) {
    if (n) MOESQ_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  }
  DevBuf(const T* host, size_t count) : DevBuf(count) {
    if (n) MOESQ_CUDA_CHECK(cudaMemcpy(p, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

__global__ void align_scatter_kernel(const int32_t* topk_ids, int64_t R, const int32_t* expert_offset,
                                     int32_t* cursor, int32_t* sorted_ids) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= R) return;
  const int32_t e = topk_ids[r];
  const int32_t slot = atomicAdd(&cursor[e], 1);  // the order inside an expert = atomic order
  sorted_ids[expert_offset[e] + slot] = static_cast<int32_t>(r);
}

// H1's persistent tensors (held from prepare_history to release_history).
struct HistoryTensors {
  DevBuf<uint16_t>* x = nullptr;
  DevBuf<float>* w = nullptr;
  DevBuf<int32_t>* ids = nullptr;
} g_history;

void release_history_tensors() {
  delete g_history.x;
  delete g_history.w;
  delete g_history.ids;
  g_history = {};
}

}  // namespace

moe::RouteAlignment align_routes_cuda(const std::vector<int32_t>& topk_ids, int64_t M, int topk, int num_experts,
                                      int block_size) {
  // Region sizes are the same for every order; the scatter order is the device's.
  moe::RouteAlignment a = moe::align_routes(topk_ids, M, topk, num_experts, block_size, moe::AlignOrder::Canonical);
  std::vector<int32_t> offset(num_experts, 0);
  for (int64_t p = a.num_blocks() - 1; p >= 0; --p) offset[a.block_expert[p]] = static_cast<int32_t>(p * block_size);
  const int64_t R = M * topk;
  DevBuf<int32_t> d_ids(topk_ids.data(), topk_ids.size()), d_off(offset.data(), offset.size()),
      d_cursor(num_experts), d_sorted(a.sorted_ids.data(), a.sorted_ids.size());
  MOESQ_CUDA_CHECK(cudaMemset(d_cursor.p, 0, num_experts * sizeof(int32_t)));
  if (R > 0) {
    align_scatter_kernel<<<static_cast<unsigned>((R + 63) / 64), 64>>>(d_ids.p, R, d_off.p, d_cursor.p, d_sorted.p);
    MOESQ_CUDA_LAUNCH_CHECK("align_scatter_kernel");
  }
  MOESQ_CUDA_CHECK(cudaMemcpy(a.sorted_ids.data(), d_sorted.p, a.sorted_ids.size() * 4, cudaMemcpyDeviceToHost));
  return a;
}

void awq_moe_gemm_cuda_host(const moe::AwqMoeGemmDesc& d) {
  moe::awq_moe_gemm_check(d);
  MOESQ_CHECK(d.C_f32 == nullptr, "awq_moe_gemm_cuda_host: the fp32 capture (C_f32) exists only in the _ref");
  if (!awq_gemm_cuda_supported(*d.sched, d.align->block_size)) return moe::awq_moe_gemm_ref(d);
  const moe::RouteAlignment& a = *d.align;
  const auto& W = *d.weights;
  std::vector<int32_t> slot(W.size(), -1), qw, qz;
  std::vector<uint16_t> sc;
  int nslots = 0;
  for (int32_t e : a.block_expert)
    if (slot[e] < 0) {
      slot[e] = nslots++;
      qw.insert(qw.end(), W[e].qweight.begin(), W[e].qweight.end());
      qz.insert(qz.end(), W[e].qzeros.begin(), W[e].qzeros.end());
      sc.insert(sc.end(), W[e].scales.begin(), W[e].scales.end());
    }
  const int64_t R = a.num_routes();
  DevBuf<uint16_t> dA(d.A, d.num_a_rows * d.K), dS(sc.data(), sc.size()), dC(R * d.N);
  DevBuf<int32_t> dIds(a.sorted_ids.data(), a.sorted_ids.size()), dBE(a.block_expert.data(), a.block_expert.size()),
      dSlot(slot.data(), slot.size()), dQW(qw.data(), qw.size()), dQZ(qz.data(), qz.size());
  DevBuf<float> ws(static_cast<size_t>(awq_workspace_floats(*d.sched)));
  MOESQ_CUDA_CHECK(cudaMemset(dC.p, 0, R * d.N * 2));
  AwqMoeGemmCudaDesc c;
  c.A = reinterpret_cast<const __half*>(dA.p);
  c.a_row_div = d.a_row_div;
  c.sorted_ids = dIds.p;
  c.block_expert = dBE.p;
  c.expert_slot = dSlot.p;
  c.sentinel = a.sentinel();
  c.block_size = a.block_size;
  c.qweight = dQW.p;
  c.qzeros = dQZ.p;
  c.scales = reinterpret_cast<const __half*>(dS.p);
  c.C = reinterpret_cast<__half*>(dC.p);
  c.workspace = ws.p;
  c.sched = *d.sched;
  awq_moe_gemm_cuda(c, nullptr);
  MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
  MOESQ_CUDA_CHECK(cudaMemcpy(d.C, dC.p, R * d.N * 2, cudaMemcpyDeviceToHost));
}

moe::AuditBackend cuda_audit_backend() {
  moe::AuditBackend b;
  b.device = "cuda";
  b.prepare_history = [](const std::string& h, const moe::AuditFixture& f) {
    moe::history_seed(h);  // validates the name
    release_history_tensors();
    if (h == "H1") {  // three persistent tensors shaped like the inputs, filled once, never used
      g_history.x = new DevBuf<uint16_t>(f.x.data(), f.x.size());
      g_history.w = new DevBuf<float>(f.topk_weights.data(), f.topk_weights.size());
      g_history.ids = new DevBuf<int32_t>(f.topk_ids.data(), f.topk_ids.size());
      MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    }
  };
  b.align_native = [](const moe::AuditFixture& f, const std::string&) {
    return align_routes_cuda(f.topk_ids, f.M, f.topk, f.num_experts, f.block_size);
  };
  b.run_layer = [](const moe::AuditFixture& f, const moe::RouteAlignment& a, const moe::LayerRunSpec& spec) {
    return moe::run_awq_moe_layer(f.x, f.topk_weights, a, f.weights, spec, awq_moe_gemm_cuda_host);
  };
  b.release_history = [] { release_history_tensors(); };
  return b;
}

}  // namespace moesq::cuda

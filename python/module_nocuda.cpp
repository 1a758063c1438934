// CPU-only builds: the module says it has no GPU path (moesq.built_with_cuda() and
// moesq.cuda_available() are False; there is no moesq.Engine). The GPU ops (gpu_ops.h) still check
// their arguments — the same code as in CUDA builds — and then refuse by name, here.
#include <pybind11/pybind11.h>

#include "core/error.h"
#include "gpu_ops.h"

namespace moesq::py {

namespace {

[[noreturn]] void no_cuda(const std::string& fn) {
  MOESQ_FAIL(fn, ": this moesq module was built without CUDA (moesq.built_with_cuda() is False); rebuild with nvcc "
                 "on PATH (-DMOESQ_CUDA=ON) for the GPU ops");
}

}  // namespace

struct MoeLayerDevice {};

void register_cuda(pybind11::module_& m) {
  m.def("built_with_cuda", [] { return false; }, "False: this moesq module was built without CUDA (no moesq.Engine)");
  m.def("cuda_available", [] { return false; }, "False: a module built without CUDA never sees a GPU");
}

std::vector<Tensor> launch_act_quant(const ActQuantCall& c) { no_cuda(c.fn); }
std::vector<Tensor> launch_dispatch(const DispatchCall& c) { no_cuda(c.fn); }
std::vector<Tensor> launch_sparse_gemm(const SparseGemmCall& c) { no_cuda(c.fn); }
std::pair<std::string, std::string> sparse_gemm_config(int, int, int64_t, int64_t, int) {
  no_cuda("moesq.sparse_gemm_config");
}
std::shared_ptr<MoeLayerDevice> upload_moe_layer(const runtime::HostMoeLayer&, int) { no_cuda("MoeLayer"); }
size_t moe_layer_weight_bytes(const MoeLayerDevice&) { return 0; }
std::vector<Tensor> launch_moe_layer(const MoeLayerDevice&, const MoeForwardCall& c) { no_cuda(c.fn); }

}  // namespace moesq::py

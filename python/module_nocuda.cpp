// CPU-only builds: the module says it has no GPU path (moesq.built_with_cuda() and
// moesq.cuda_available() are False; there is no moesq.Engine).
#include <pybind11/pybind11.h>

namespace moesq::py {

void register_cuda(pybind11::module_& m) {
  m.def("built_with_cuda", [] { return false; }, "False: this moesq module was built without CUDA (no moesq.Engine)");
  m.def("cuda_available", [] { return false; }, "False: a module built without CUDA never sees a GPU");
}

}  // namespace moesq::py

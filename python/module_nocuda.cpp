// CPU-only builds: the module says it has no GPU path (moesq.cuda_available() is False).
#include <pybind11/pybind11.h>

namespace moesq::py {

void register_cuda(pybind11::module_& m) {
  m.def("cuda_available", [] { return false; }, "True when this moesq module was built with CUDA");
}

}  // namespace moesq::py

// CUDA builds: the whole model on one GPU through the runtime engine (runtime/engine.h), as
// `moesq eval --device cuda` runs it. moesq.Engine(dir, experts="auto", check_finite=False).logits(tokens)
// → float32 [T, V] logits of one causal sequence (host tensor: the engine returns logits to the host);
// check_finite: the engine's NaN / inf check (--check-finite), its error raised as moesq.Error.
// Token ids are read on the host: a CUDA tensor of ids is refused by name (copy it with .cpu()) —
// the engine takes host ids, so there is no device memory whose stream would need honouring here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "dlpack_bridge.h"
#include "io/checkpoint.h"
#include "runtime/backend.h"
#include "runtime/engine.h"

namespace pyb = pybind11;

namespace moesq::py {

namespace {

struct EnginePy {
  std::shared_ptr<runtime::Engine> eng;
};

}  // namespace

void register_cuda(pyb::module_& m) {
  m.def("built_with_cuda", [] { return true; }, "True: this moesq module was built with CUDA (moesq.Engine exists)");
  m.def(
      "cuda_available",
      [] {
        int n = 0;
        const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
        (void)cudaGetLastError();  // a machine without a GPU leaves a sticky "no device" error: clear it
        return ok;
      },
      "True when this module was built with CUDA and the CUDA runtime sees at least one GPU");
  pyb::class_<EnginePy>(m, "Engine", "The whole model on one GPU (runtime::Engine): weights uploaded once")
      .def(pyb::init([](const std::string& dir, const std::string& experts, int64_t max_len, bool check_finite) {
             pyb::gil_scoped_release nogil;
             const io::Checkpoint ck(dir);
             runtime::EngineOptions eo;
             eo.experts = runtime::parse_expert_backend(experts);
             eo.max_seqs = 1;
             eo.max_len = max_len;
             eo.max_tokens = max_len;
             eo.check_finite = check_finite;  // logits() raises naming the layer / expert of the first NaN or inf
             return EnginePy{std::make_shared<runtime::Engine>(ck, eo)};
           }),
           pyb::arg("dir"), pyb::arg("experts") = "auto", pyb::arg("max_len") = 1024, pyb::arg("check_finite") = false)
      .def_property_readonly("backend", [](const EnginePy& e) { return runtime::expert_backend_name(e.eng->backend()); })
      .def_property_readonly("expert_format", [](const EnginePy& e) { return e.eng->expert_format(); })
      .def_property_readonly("act_quant", [](const EnginePy& e) { return e.eng->act_quant(); })
      .def(
          "logits",
          [](EnginePy& e, const pyb::object& tokens) {
            const DlView v(tokens, {"Engine.logits", "tokens", {DType::I32, DType::I64}, {-1}});
            const int64_t V = e.eng->spec().vocab_size;
            std::vector<int32_t> ids(static_cast<size_t>(v.numel()));
            for (int64_t i = 0; i < v.numel(); ++i) {
              const int64_t t = v.dtype() == DType::I32 ? v.as<int32_t>()[i] : v.as<int64_t>()[i];
              if (t < 0 || t >= V)
                throw pyb::value_error("Engine.logits: token id " + std::to_string(t) + " at position " +
                                       std::to_string(i) + " outside the vocabulary [0, " + std::to_string(V) + ")");
              ids[static_cast<size_t>(i)] = static_cast<int32_t>(t);
            }
            std::vector<float> z;
            {
              pyb::gil_scoped_release nogil;
              e.eng->reset();
              z = e.eng->forward({{0, ids}}, true);
            }
            return Tensor::host_from(DType::F32, {static_cast<int64_t>(ids.size()), V}, z);
          },
          pyb::arg("tokens"), "tokens int32/int64 [T] (host) → logits float32 [T, V] (one sequence, KV cache reset)");
}

}  // namespace moesq::py

// The `moesq` Python module: thin bindings over the library (DESIGN.md §2: no logic here). Tensors
// cross as DLPack (python/dlpack_bridge.h): inputs are any __dlpack__ producer (NumPy, PyTorch, …)
// checked for dtype / shape / device, outputs are moesq.Tensor objects that numpy.from_dlpack /
// torch.from_dlpack view without copying.
//
// CPU path (always): a checkpoint's model (logits of one sequence, one MoE layer, the layer steps
// Algorithm 1 walks), the `_ref` ops of the expert pipeline (act_quant_row_ref, dispatch_ref,
// sparse_gemm_ref on kernel-layout weights) and one expert's compression (SGPTQ / magnitude / RTN on the
// CPU). GPU path: python/module_cuda.cpp (moesq.Engine, CUDA builds) and python/gpu_ops.* (act_quant,
// dispatch, sparse_gemm, MoeLayer on CUDA tensors, every build: refused by name without CUDA).
// Errors: moesq::Error → RuntimeError with the library's message (it names the file / tensor / flag);
// bad tensors → TypeError / ValueError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>

#include <optional>
#include <string>
#include <vector>

#include "compress/pipeline.h"
#include "core/error.h"
#include "core/half.h"
#include "dlpack_bridge.h"
#include "gpu_ops.h"
#include "format/kernel_layout.h"
#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "io/tensor_names.h"
#include "model/decoder.h"
#include "ops/act_dispatch/act_dispatch.h"
#include "ops/common/act_batch.h"
#include "ops/sparse_gemm/sparse_gemm.h"

namespace pyb = pybind11;
using moesq::py::DlView;
using moesq::py::DType;
using moesq::py::Expect;
using moesq::py::Tensor;

namespace moesq::py {

void register_cuda(pyb::module_& m);  // module_cuda.cpp (CUDA builds) or module_nocuda.cpp

namespace {

// A loaded checkpoint: the CPU model (immutable) and its directory.
struct Model {
  std::string dir;
  std::shared_ptr<const model::DecoderModel> m;
  const io::ModelSpec& spec() const { return m->spec(); }
};

model::ForwardOptions forward_options(const Model& md, std::optional<bool> act_quant) {
  model::ForwardOptions fo = md.m->default_forward_options();
  if (act_quant) fo.act_quant = *act_quant;
  return fo;
}

void check_layer(const Model& md, int64_t layer, const char* fn) {
  if (layer < 0 || layer >= md.spec().num_layers)
    throw pyb::index_error(std::string(fn) + ": layer " + std::to_string(layer) + " outside [0, " +
                           std::to_string(md.spec().num_layers) + ")");
}

std::vector<int32_t> token_ids(const pyb::object& obj, const Model& md, const char* fn) {
  const DlView v(obj, {fn, "tokens", {DType::I32, DType::I64}, {-1}});
  std::vector<int32_t> ids(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) {
    const int64_t t = v.dtype() == DType::I32 ? v.as<int32_t>()[i] : v.as<int64_t>()[i];
    if (t < 0 || t >= md.spec().vocab_size)
      throw pyb::value_error(std::string(fn) + ": token id " + std::to_string(t) + " at position " + std::to_string(i) +
                             " outside the vocabulary [0, " + std::to_string(md.spec().vocab_size) + ")");
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(t);
  }
  if (ids.empty()) throw pyb::value_error(std::string(fn) + ": tokens is empty");
  return ids;
}

std::vector<float> rows_f32(const pyb::object& obj, int64_t cols, const char* fn, const char* arg, int64_t* n) {
  const DlView v(obj, {fn, arg, {DType::F32}, {-1, cols}});
  *n = v.dim(0);
  return std::vector<float>(v.as<float>(), v.as<float>() + v.numel());
}

Tensor f32(std::vector<int64_t> shape, const std::vector<float>& v) { return Tensor::host_from(DType::F32, std::move(shape), v); }

// ValueError naming fn, arg and the first non-finite element [row, col] of a row-major [n, cols] input
// (a NaN calibration row poisons the Hessian; the solver's fallback would hide it).
void check_finite_rows(const float* v, int64_t n, int64_t cols, const char* fn, const char* arg) {
  for (int64_t i = 0; i < n * cols; ++i)
    if (!std::isfinite(v[i]))
      throw pyb::value_error(std::string(fn) + ": argument '" + arg + "' holds a non-finite value (" +
                             (std::isnan(v[i]) ? "nan" : v[i] > 0 ? "inf" : "-inf") + ") at [" + std::to_string(i / cols) +
                             ", " + std::to_string(i % cols) + "] of [" + std::to_string(n) + ", " +
                             std::to_string(cols) + "]");
}


// All experts of projection `proj` of one layer in kernel layout (paired 4:8 checkpoints).
struct KernelWeightsPy {
  std::shared_ptr<format::KernelWeights> w;
};

KernelWeightsPy load_kernel_weights(const std::string& dir, int64_t layer, const std::string& proj) {
  const io::Checkpoint ck(dir);
  const io::ModelSpec& s = ck.spec();
  MOESQ_CHECK(layer >= 0 && layer < s.num_layers && s.is_moe_layer(layer), "kernel_weights: layer ", layer,
              " is not a MoE layer of ", dir);
  const bool down = proj == "down_proj";
  MOESQ_CHECK(down || proj == "gate_proj" || proj == "up_proj", "kernel_weights: proj \"", proj,
              "\" is not one of gate_proj, up_proj, down_proj");
  const io::ExpertProj p = down ? io::ExpertProj::Down : proj == "up_proj" ? io::ExpertProj::Up : io::ExpertProj::Gate;
  const int64_t N = down ? s.hidden_size : s.moe_intermediate_size, K = down ? s.moe_intermediate_size : s.hidden_size;
  const io::QuantizationConfig q = io::read_quantization_config(ck);
  MOESQ_CHECK(q.storage == io::ExpertStorage::Sparse48, "kernel_weights: ", dir, " holds ", q.format_name,
              " experts, not paired 4:8 NVFP4 (config.json quantization_config); compress it first (moesq compress)");
  std::vector<format::PackedWeight> pw;
  for (int64_t e = 0; e < s.num_experts; ++e)
    pw.push_back(io::read_packed_weight(ck, q, io::expert_tensor_prefix(s, layer, e, p), N, K));
  std::vector<const format::Sparse48Tensor*> ptrs;
  for (int64_t e = 0; e < s.num_experts; ++e) {
    MOESQ_CHECK(pw[e].is_sparse48(), "kernel_weights: ", io::expert_tensor_prefix(s, layer, e, p), " in ", dir,
                " is dense NVFP4, not paired 4:8 (the sparse GEMM runs paired 4:8 experts)");
    ptrs.push_back(pw[e].sparse48());
  }
  return {std::make_shared<format::KernelWeights>(format::kernel_layout_from_sparse48(ptrs, dir + " " + proj))};
}

pyb::dict compress_expert_py(const pyb::object& gate, const pyb::object& up, const pyb::object& down,
                             const pyb::object& x, const std::string& method, double percdamp, int64_t layer,
                             int64_t expert) {
  const char* fn = "moesq.compress_expert";
  const DlView g(gate, {fn, "gate", {DType::F32}, {-1, -1}});
  const int64_t I = g.dim(0), H = g.dim(1);
  const DlView u(up, {fn, "up", {DType::F32}, {I, H}});
  const DlView d(down, {fn, "down", {DType::F32}, {H, I}});
  compress::ExpertCalib c;
  c.X = rows_f32(x, H, fn, "x", &c.n);
  check_finite_rows(g.as<float>(), I, H, fn, "gate");
  check_finite_rows(u.as<float>(), I, H, fn, "up");
  check_finite_rows(d.as<float>(), H, I, fn, "down");
  check_finite_rows(c.X.data(), c.n, H, fn, "x");
  c.g.assign(static_cast<size_t>(c.n), 1.0f);
  compress::CompressOptions opt;
  opt.method = compress::parse_method(method);
  if (opt.method == &compress::methods::kMoesq)
    throw pyb::value_error(std::string(fn) + ": method \"moesq\" (refinement) is not exposed; use sgptq, magnitude or rtn-nvfp4");
  opt.sgptq.percdamp = percdamp;
  compress::validate(opt);
  model::ExpertWeights w;
  w.gate.assign(g.as<float>(), g.as<float>() + g.numel());
  w.up.assign(u.as<float>(), u.as<float>() + u.numel());
  w.down.assign(d.as<float>(), d.as<float>() + d.numel());
  compress::ExpertReport rep;
  rep.layer = layer, rep.expert = expert;
  io::ModelSpec spec;  // names the tensors in errors: the Qwen3-MoE layout
  spec.model_type = "qwen3_moe";
  const compress::PackedExpert pe = compress::compress_expert(spec, w, H, I, c, {}, opt, rep);
  pyb::dict out;
  const char* names[3] = {"gate", "up", "down"};
  for (int p = 0; p < 3; ++p) {
    const format::PackedWeight& pw = pe.proj[p];
    out[names[p]] = f32({pw.N(), pw.K()}, pw.dequantize());
    out[(std::string(names[p]) + "_global_scale").c_str()] = pw.global_scale();
  }
  out["format"] = pe.proj[0].is_sparse48() ? "paired-4:8-nvfp4" : "nvfp4";
  out["fallback"] = rep.fallback;
  out["note"] = rep.note;
  return out;
}

}  // namespace

}  // namespace moesq::py

PYBIND11_MODULE(moesq, m) {
  using namespace moesq::py;
  namespace io = moesq::io;
  namespace model = moesq::model;
  namespace format = moesq::format;
  namespace ops = moesq::ops;
  m.doc() = "moesq: paired 4:8 NVFP4 MoE experts — checkpoints, the CPU model, the expert ops, SGPTQ (DLPack in/out)";
  pyb::register_exception<moesq::Error>(m, "Error", PyExc_RuntimeError);

  pyb::class_<Tensor>(m, "Tensor", pyb::buffer_protocol(),
                      "A tensor moesq produced, zero-copy: numpy.asarray(t) is a writable view of a host tensor (buffer\n"
                      "protocol); numpy.from_dlpack / torch.from_dlpack view it through DLPack (NumPy < 2 makes that\n"
                      "view read-only; moesq accepts it back either way)")
      .def_buffer([](const Tensor& t) { return t.buffer(); })
      .def("__dlpack__",
           [](const Tensor& t, const pyb::object& stream, const pyb::object& max_version, const pyb::object& dl_device,
              const pyb::object& copy) {
             // Legacy (unversioned) capsules only: a consumer asking max_version >= (1, 0) accepts them too.
             (void)max_version;
             if (!dl_device.is_none() && !pyb::tuple(dl_device).equal(t.dlpack_device()))
               throw pyb::buffer_error("moesq.Tensor.__dlpack__: cannot export to another device (dl_device)");
             if (!copy.is_none() && pyb::cast<bool>(copy))
               throw pyb::buffer_error("moesq.Tensor.__dlpack__: copy=True is not supported (exports are views)");
             return t.dlpack(stream);
           },
           pyb::arg("stream") = pyb::none(), pyb::kw_only(),
           pyb::arg("max_version") = pyb::none(), pyb::arg("dl_device") = pyb::none(), pyb::arg("copy") = pyb::none())
      .def("__dlpack_device__", &Tensor::dlpack_device)
      .def_property_readonly("shape", [](const Tensor& t) { return pyb::tuple(pyb::cast(t.shape())); })
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("device", &Tensor::device_str)
      .def_property_readonly("data_ptr", &Tensor::data_ptr,
                             "address of the first element (host or device): every DLPack view of this tensor starts there")
      .def("__repr__", [](const Tensor& t) {
        return "moesq.Tensor(shape=" + std::string(pyb::str(pyb::tuple(pyb::cast(t.shape())))) + ", dtype=" + t.dtype() +
               ", device=" + t.device_str() + ")";
      });

  pyb::class_<Model>(m, "Model", "A checkpoint loaded for the CPU forward (model::DecoderModel, immutable)")
      .def_readonly("dir", &Model::dir)
      .def_property_readonly("config", [](const Model& md) {
        const io::ModelSpec& s = md.spec();
        pyb::dict d;
        d["vocab_size"] = s.vocab_size, d["hidden_size"] = s.hidden_size, d["num_layers"] = s.num_layers;
        d["num_experts"] = s.num_experts, d["top_k"] = s.top_k, d["moe_intermediate_size"] = s.moe_intermediate_size;
        d["model_type"] = s.model_type;
        return d;
      })
      .def_property_readonly("expert_format", [](const Model& md) { return md.m->expert_format(); })
      .def_property_readonly("act_quant", [](const Model& md) { return md.m->default_forward_options().act_quant; },
                             "True: the checkpoint runs W4A4 (NVFP4 activations) by default")
      .def_property_readonly("act_block", [](const Model& md) { return md.m->default_forward_options().act_block; })
      .def(
          "logits",
          [](const Model& md, const pyb::object& tokens, std::optional<bool> act_quant) {
            const std::vector<int32_t> ids = token_ids(tokens, md, "Model.logits");
            std::vector<float> z;
            {
              pyb::gil_scoped_release nogil;
              z = md.m->forward(ids, forward_options(md, act_quant));
            }
            return f32({static_cast<int64_t>(ids.size()), md.spec().vocab_size}, z);
          },
          pyb::arg("tokens"), pyb::arg("act_quant") = pyb::none(),
          "tokens: int32/int64 [T] (one causal sequence) → logits float32 [T, V]. act_quant None: the checkpoint's "
          "default (W4A4 when compressed)")
      .def(
          "embed",
          [](const Model& md, const pyb::object& tokens) {
            const std::vector<int32_t> ids = token_ids(tokens, md, "Model.embed");
            return f32({static_cast<int64_t>(ids.size()), md.spec().hidden_size}, md.m->embed(ids));
          },
          pyb::arg("tokens"), "tokens [T] → hidden states float32 [T, H]")
      .def(
          "attention_block",
          [](const Model& md, int64_t layer, const pyb::object& h) {
            check_layer(md, layer, "Model.attention_block");
            int64_t T = 0;
            std::vector<float> x = rows_f32(h, md.spec().hidden_size, "Model.attention_block", "h", &T);
            md.m->attention_block(layer, x, T, md.m->default_forward_options());
            return f32({T, md.spec().hidden_size}, x);
          },
          pyb::arg("layer"), pyb::arg("h"), "h float32 [T, H] (one sequence) → h + o_proj(attn(rmsnorm(h))) [T, H]")
      .def(
          "moe_input",
          [](const Model& md, int64_t layer, const pyb::object& h) {
            check_layer(md, layer, "Model.moe_input");
            int64_t n = 0;
            const std::vector<float> x = rows_f32(h, md.spec().hidden_size, "Model.moe_input", "h", &n);
            return f32({n, md.spec().hidden_size}, md.m->moe_input(layer, x, n));
          },
          pyb::arg("layer"), pyb::arg("h"), "post_attention_layernorm: float32 [n, H] → [n, H]")
      .def(
          "route",
          [](const Model& md, int64_t layer, const pyb::object& x) {
            check_layer(md, layer, "Model.route");
            int64_t n = 0;
            const std::vector<float> v = rows_f32(x, md.spec().hidden_size, "Model.route", "x", &n);
            const model::Routes r = md.m->route(layer, v, n);
            return pyb::make_tuple(Tensor::host_from(DType::I32, {r.n, r.k}, r.expert), f32({r.n, r.k}, r.weight));
          },
          pyb::arg("layer"), pyb::arg("x"),
          "MoE input float32 [n, H] → (expert ids int32 [n, top_k], combine weights float32 [n, top_k])")
      .def(
          "moe_layer",
          [](const Model& md, int64_t layer, const pyb::object& x, std::optional<bool> act_quant) {
            check_layer(md, layer, "Model.moe_layer");
            if (!md.spec().is_moe_layer(layer))
              throw pyb::value_error("Model.moe_layer: layer " + std::to_string(layer) + " is a dense MLP layer");
            int64_t n = 0;
            const std::vector<float> v = rows_f32(x, md.spec().hidden_size, "Model.moe_layer", "x", &n);
            std::vector<float> y;
            {
              pyb::gil_scoped_release nogil;
              const model::Routes r = md.m->route(layer, v, n);
              y = md.m->moe_block(layer, v, r, forward_options(md, act_quant));
            }
            return f32({n, md.spec().hidden_size}, y);
          },
          pyb::arg("layer"), pyb::arg("x"), pyb::arg("act_quant") = pyb::none(),
          "One MoE layer: route + routed experts + weighted combine. x float32 [n, H] (the MoE input, after "
          "post_attention_layernorm) → y float32 [n, H] (not added to the residual)")
      .def(
          "expert_weights",
          [](const Model& md, int64_t layer, int64_t expert) {
            check_layer(md, layer, "Model.expert_weights");
            if (expert < 0 || expert >= md.spec().num_experts)
              throw pyb::index_error("Model.expert_weights: expert " + std::to_string(expert) + " outside [0, " +
                                     std::to_string(md.spec().num_experts) + ")");
            const model::ExpertWeights& w = md.m->layer(layer).experts[static_cast<size_t>(expert)];
            const int64_t H = md.spec().hidden_size, I = md.spec().moe_intermediate_size;
            return pyb::make_tuple(f32({I, H}, w.gate), f32({I, H}, w.up), f32({H, I}, w.down));
          },
          pyb::arg("layer"), pyb::arg("expert"),
          "(gate [I, H], up [I, H], down [H, I]) float32 — the exact dequantized values of a compressed checkpoint");

  m.def(
      "load",
      [](const std::string& dir, bool allow_mixed) {
        Model md;
        md.dir = dir;
        pyb::gil_scoped_release nogil;
        const io::Checkpoint ck(dir);
        md.m = std::make_shared<const model::DecoderModel>(ck, model::LoadOptions{.allow_mixed = allow_mixed});
        return md;
      },
      pyb::arg("dir"), pyb::arg("allow_mixed") = false,
      "Loads a checkpoint directory (HF bf16, moesq, compressed-tensors NVFP4 / pair-bitmask / INT4) for the CPU path");

  pyb::class_<KernelWeightsPy>(m, "KernelWeights", "All experts of one projection in the sparse GEMM's kernel layout")
      .def_property_readonly("num_experts", [](const KernelWeightsPy& k) { return k.w->num_experts; })
      .def_property_readonly("M", [](const KernelWeightsPy& k) { return k.w->M; })
      .def_property_readonly("K", [](const KernelWeightsPy& k) { return k.w->K; })
      .def_property_readonly("M_pad", [](const KernelWeightsPy& k) { return k.w->M_pad; })
      .def_property_readonly("K_pad", [](const KernelWeightsPy& k) { return k.w->K_pad; })
      .def_property_readonly("gamma", [](const KernelWeightsPy& k) { return f32({k.w->num_experts}, k.w->gamma); })
      .def_property_readonly(
          "inv_gamma",
          [](const KernelWeightsPy& k) {
            std::vector<float> inv(k.w->gamma.size());
            for (size_t e = 0; e < inv.size(); ++e) inv[e] = 1.0f / k.w->gamma[e];
            return f32({k.w->num_experts}, inv);
          },
          "float32 [E] 1/γ_w, the GEMM epilogue factor (moesq.sparse_gemm's w_inv_gamma, after .cuda())")
      .def_property_readonly(
          "packed",
          [](const KernelWeightsPy& k) {
            return Tensor::host_from(DType::U8, {k.w->num_experts, k.w->m_tiles(), k.w->k_chunks(), format::kChunkBytes},
                                     k.w->data);
          },
          "uint8 [E, M_pad/16, K_pad/256, 1408] the kernel-layout bytes (docs/KERNEL_LAYOUT.md; moesq.sparse_gemm's w, "
          "after .cuda()) — a host copy")
      .def(
          "unpack_ref",
          [](const KernelWeightsPy& k, int e) {
            if (e < 0 || e >= k.w->num_experts) throw pyb::index_error("KernelWeights.unpack_ref: expert out of range");
            std::vector<float> out(static_cast<size_t>(k.w->M * k.w->K));
            format::kernel_layout_unpack_ref(*k.w, e, out.data());
            return f32({k.w->M, k.w->K}, out);
          },
          pyb::arg("expert"), "expert e's weights dec(q)·dec(scale) WITHOUT 1/γ, float32 [M, K]");
  m.def("kernel_weights", &load_kernel_weights, pyb::arg("dir"), pyb::arg("layer"), pyb::arg("proj"),
        "Reads projection proj (gate_proj | up_proj | down_proj) of every expert of `layer` from a paired 4:8 checkpoint "
        "and reorders it into the kernel layout (format/kernel_layout.h)");

  m.def(
      "act_quant_ref",
      [](const pyb::object& x, bool quantize, const std::string& layout) {
        const DlView v(x, {"moesq.act_quant_ref", "x", {DType::U16, DType::BF16, DType::F32}, {-1, -1}});
        const int64_t T = v.dim(0), K = v.dim(1), K_pad = format::padded_k(K);
        const format::ActLayout lay = parse_act_layout(layout, "moesq.act_quant_ref");
        if (v.dtype() == DType::F32 && !quantize)
          throw pyb::value_error("moesq.act_quant_ref: argument 'x' is float32; quantize=False (W4A16) takes bf16 rows");
        std::vector<uint16_t> out(static_cast<size_t>(T * K_pad), 0);
        std::vector<float> inv(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
          if (v.dtype() == DType::F32)
            ops::act_quant_row_f32_ref(v.as<float>() + t * K, K, out.data() + t * K_pad, &inv[t], lay);
          else
            ops::act_quant_row_ref(v.as<uint16_t>() + t * K, K, quantize, out.data() + t * K_pad, &inv[t], lay);
        }
        return pyb::make_tuple(Tensor::host_from(DType::U16, {T, K_pad}, out), f32({T}, inv));
      },
      pyb::arg("x"), pyb::arg("quantize") = true, pyb::arg("layout") = "mma-fragment",
      "NVFP4 activation quantizer (ops/common/act_batch.h act_quant_row_ref): x bf16 [T, K] (bfloat16, or uint16 bf16 "
      "bits; or float32 rows, quantized in fp32 as act_quant_row_f32_ref — the GPU act_quant with x_lo reads x + x_lo so) → "
      "(rows bf16 bits uint16 [T, K_pad] in kernel K order holding dec(q)·dec(scale), 1/γ_a float32 [T])");

  m.def(
      "dispatch_ref",
      [](const pyb::object& x, const pyb::object& topk_ids, int num_experts, int capacity, bool quantize,
         const std::string& layout) {
        const DlView v(x, {"moesq.dispatch_ref", "x", {DType::U16, DType::BF16}, {-1, -1}});
        const DlView ids(topk_ids, {"moesq.dispatch_ref", "topk_ids", {DType::I32}, {v.dim(0), -1}});
        const ops::ActBatch b = ops::act_dispatch_batch_ref(v.as<uint16_t>(), v.dim(0), v.dim(1), ids.as<int32_t>(),
                                                  static_cast<int>(ids.dim(1)), num_experts, capacity, quantize,
                                                  parse_act_layout(layout, "moesq.dispatch_ref"));
        pyb::dict d;
        d["x"] = Tensor::host_from(DType::U16, {b.num_experts, b.capacity, b.K_pad}, b.x);
        d["inv_scale"] = f32({b.num_experts, b.capacity}, b.inv_scale);
        d["counts"] = Tensor::host_from(DType::I32, {b.num_experts}, b.counts);
        d["route_of_slot"] = Tensor::host_from(DType::I32, {b.num_experts, b.capacity}, b.route_of_slot);
        return d;
      },
      pyb::arg("x"), pyb::arg("topk_ids"), pyb::arg("num_experts"), pyb::arg("capacity"), pyb::arg("quantize") = true,
      pyb::arg("layout") = "mma-fragment",
      "Routes → per-expert batches (ops/act_dispatch dispatch_ref): x bf16 [T, K], topk_ids int32 [T, top_k] → dict "
      "x uint16 [E, capacity, K_pad], inv_scale float32 [E, capacity], counts int32 [E], route_of_slot int32 [E, capacity]");

  m.def(
      "sparse_gemm_ref",
      [](const KernelWeightsPy& w, const pyb::object& x, const pyb::object& x_inv_scale, const pyb::object& counts,
         const std::string& layout) {
        const char* fn = "moesq.sparse_gemm_ref";
        const format::KernelWeights& kw = *w.w;
        const DlView xv(x, {fn, "x", {DType::U16, DType::BF16}, {kw.num_experts, -1, kw.K_pad}});
        const int capacity = static_cast<int>(xv.dim(1));
        std::optional<DlView> sv;
        if (!x_inv_scale.is_none()) sv.emplace(x_inv_scale, Expect{fn, "x_inv_scale", {DType::F32}, {kw.num_experts, capacity}});
        const DlView cv(counts, {fn, "counts", {DType::I32}, {kw.num_experts}});
        std::vector<float> y(static_cast<size_t>(kw.num_experts) * capacity * kw.M, 0.0f);
        moesq::ops::SparseGemmArgs a;
        a.w = kw.data.data();
        std::vector<float> inv_gamma(kw.gamma.size());
        for (size_t e = 0; e < kw.gamma.size(); ++e) inv_gamma[e] = 1.0f / kw.gamma[e];
        a.w_inv_gamma = inv_gamma.data();
        a.x = xv.as<uint16_t>();
        a.x_layout = parse_act_layout(layout, fn);
        a.x_inv_scale = sv ? sv->as<float>() : nullptr;
        a.counts = cv.as<int32_t>();
        a.y_f32 = y.data();
        a.num_experts = kw.num_experts, a.capacity = capacity;
        a.M = kw.M, a.M_pad = kw.M_pad, a.K_pad = kw.K_pad, a.ldy = kw.M;
        {
          pyb::gil_scoped_release nogil;
          moesq::ops::sparse_gemm_ref(a);
        }
        return f32({kw.num_experts, capacity, kw.M}, y);
      },
      pyb::arg("w"), pyb::arg("x"), pyb::arg("x_inv_scale"), pyb::arg("counts"), pyb::arg("layout") = "mma-fragment",
      "Grouped sparse GEMM, CPU twin (ops/sparse_gemm sparse_gemm_ref): Y_e[slot, m] = (1/γ_w)(1/γ_a) Σ_k Ŵ_e[m,k] X̂_e[slot,k]. "
      "x bf16 [E, capacity, K_pad] (kernel K order, e.g. dispatch_ref's), x_inv_scale float32 [E, capacity] or None "
      "(W4A16), counts int32 [E] → y float32 [E, capacity, M]; slots ≥ count stay 0");

  m.def("compress_expert", &compress_expert_py, pyb::arg("gate"), pyb::arg("up"), pyb::arg("down"), pyb::arg("x"),
        pyb::arg("method") = "sgptq", pyb::arg("percdamp") = 0.01, pyb::arg("layer") = 0, pyb::arg("expert") = 0,
        "Compresses one SwiGLU expert on the CPU as `moesq compress` does (compress::compress_expert): gate, up float32 "
        "[I, H], down [H, I], calibration rows x float32 [n, H]; method sgptq | magnitude | rtn-nvfp4. Returns a dict of "
        "dequantized gate/up/down float32, their global scales, format, fallback, note");

  register_cuda(m);
  register_gpu_ops(m);
}

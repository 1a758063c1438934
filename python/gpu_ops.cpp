// GPU ops of the moesq Python module, the part compiled in EVERY build (gpu_ops.h): argument parsing
// and checks, then one launch_* call. Nothing here touches CUDA, so a refusal is the same code with or
// without a GPU and tests/python checks it on the CPU with hand-made kDLCUDA capsules.
#include "gpu_ops.h"

#include <pybind11/stl.h>

#include <cstdio>
#include <limits>
#include <optional>

#include "core/error.h"
#include "format/kernel_layout.h"
#include "io/checkpoint.h"
#include "io/import_checkpoint.h"
#include "runtime/backend.h"

namespace pyb = pybind11;

namespace moesq::py {

format::ActLayout parse_act_layout(const std::string& s, const std::string& fn) {
  if (s == "mma-fragment") return format::ActLayout::kMmaFragment;
  if (s == "k-major") return format::ActLayout::kKMajor;
  throw pyb::value_error(fn + ": argument 'layout' is \"" + s + "\", not one of mma-fragment, k-major");
}

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr uintptr_t kAlign = 16;  // the GEMM kernels load activations and weights in 16-byte vectors (TMA too)

[[noreturn]] void bad_value(const std::string& fn, const std::string& arg, const std::string& what) {
  throw pyb::value_error(fn + ": argument '" + arg + "' " + what);
}

// stream: None → 0 (the legacy default stream); an int handle ≥ 0 (torch.cuda.current_stream().cuda_stream:
// 0 is the legacy default stream; 1 cudaStreamLegacy and 2 cudaStreamPerThread as in the DLPack spec); or
// an object with .cuda_stream (torch.cuda.Stream) or .ptr (cupy.cuda.Stream).
intptr_t parse_stream(const pyb::object& s, const std::string& fn) {
  if (s.is_none()) return 0;
  pyb::object v = s;
  if (!PyLong_Check(s.ptr())) {
    if (pyb::hasattr(s, "cuda_stream")) v = s.attr("cuda_stream");
    else if (pyb::hasattr(s, "ptr")) v = s.attr("ptr");
  }
  if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr()))
    throw pyb::type_error(fn + ": argument 'stream' is a " + std::string(Py_TYPE(s.ptr())->tp_name) +
                          ", expected a CUDA stream handle (an int such as torch.cuda.current_stream().cuda_stream, "
                          "a torch.cuda.Stream, or None for the legacy default stream)");
  const long long h = PyLong_AsLongLong(v.ptr());
  if (h == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    bad_value(fn, "stream", "does not fit a 64-bit stream handle");
  }
  if (h < 0)
    bad_value(fn, "stream", "is " + std::to_string(h) + "; a stream handle is >= 0 (0 or None: the legacy default stream)");
  return static_cast<intptr_t>(h);
}

// The CUDA tensor arguments of one call, checked and kept alive (their producers' deleters run when
// this goes, after the launch has been enqueued).
class Views {
 public:
  explicit Views(GpuCall& c) : c_(c) {}

  const DlView& need(const pyb::object& obj, const char* arg, std::vector<DType> dtypes, std::vector<int64_t> dims) {
    views_.push_back(std::make_unique<DlView>(obj, Expect{c_.fn, arg, std::move(dtypes), std::move(dims), true}, c_.stream));
    const DlView& v = *views_.back();
    if (first_.empty()) {
      first_ = arg;
      c_.device = v.device_id();
    } else if (v.device_id() != c_.device) {
      bad_value(c_.fn, arg, "is on cuda:" + std::to_string(v.device_id()) + " but '" + first_ + "' is on cuda:" +
                                std::to_string(c_.device) + " (every tensor of one call must be on one device)");
    }
    if (v.numel() > 0) {
      const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
      if (p % kAlign != 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(p));
        bad_value(c_.fn, arg, std::string("starts at ") + buf + ", not 16-byte aligned (a view at an offset?); pass a "
                              "fresh contiguous tensor, e.g. .clone()");
      }
      c_.args.push_back({arg, v.data()});
    }
    return v;
  }
  const DlView* maybe(const pyb::object& obj, const char* arg, std::vector<DType> dtypes, std::vector<int64_t> dims) {
    return obj.is_none() ? nullptr : &need(obj, arg, std::move(dtypes), std::move(dims));
  }

 private:
  GpuCall& c_;
  std::string first_;
  std::vector<std::unique_ptr<DlView>> views_;
};

const std::vector<DType> kBf16 = {DType::BF16, DType::U16};

void check_k(const std::string& fn, const char* arg, int64_t K) {
  if (K <= 0 || K % 32 != 0)
    bad_value(fn, arg, "has K=" + std::to_string(K) + " columns; NVFP4 activations need a positive multiple of 32 "
                       "(one UE4M3 scale per 32 values)");
}

void check_range(const std::string& fn, const char* arg, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    bad_value(fn, arg, "is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

// The activation rows of act_quant / dispatch: x [T, K] bf16 and optional x_lo [T, K].
void activation_rows(Views& v, ops::DispatchArgs& d, const std::string& fn, const pyb::object& x,
                     const pyb::object& x_lo, bool quantize) {
  const DlView& xv = v.need(x, "x", kBf16, {-1, -1});
  d.T = xv.dim(0), d.K = xv.dim(1);
  check_k(fn, "x", d.K);
  const DlView* lo = v.maybe(x_lo, "x_lo", kBf16, {d.T, d.K});
  if (lo && !quantize)
    bad_value(fn, "x_lo", "is only read by the NVFP4 quantizer (quantize=True); with quantize=False the rows are x's "
                          "bf16 values, permuted");
  d.x = xv.as<uint16_t>();
  d.x_lo = lo ? lo->as<uint16_t>() : nullptr;
  d.K_pad = format::padded_k(d.K);
  d.quantize = quantize;
}

pyb::tuple act_quant(const pyb::object& x, const pyb::object& x_lo, bool quantize, const std::string& layout,
                     const pyb::object& stream) {
  ActQuantCall c;
  c.fn = "moesq.act_quant";
  c.stream = parse_stream(stream, c.fn);
  c.d.layout = parse_act_layout(layout, c.fn);
  Views v(c);
  activation_rows(v, c.d, c.fn, x, x_lo, quantize);
  if (c.d.T > kMaxInt) bad_value(c.fn, "x", "has T=" + std::to_string(c.d.T) + " rows, more than 2^31 - 1");
  std::vector<Tensor> out = launch_act_quant(c);
  return pyb::make_tuple(out[0], out[1]);
}

pyb::dict dispatch(const pyb::object& x, const pyb::object& topk_ids, int64_t num_experts, int64_t capacity,
                   const pyb::object& x_lo, bool quantize, const std::string& layout, const pyb::object& stream) {
  DispatchCall c;
  c.fn = "moesq.dispatch";
  c.stream = parse_stream(stream, c.fn);
  c.d.layout = parse_act_layout(layout, c.fn);
  check_range(c.fn, "num_experts", num_experts, 1, 1 << 16);
  check_range(c.fn, "capacity", capacity, 0, kMaxInt);
  Views v(c);
  activation_rows(v, c.d, c.fn, x, x_lo, quantize);
  const DlView& ids = v.need(topk_ids, "topk_ids", {DType::I32}, {c.d.T, -1});
  if (ids.dim(1) < 1) bad_value(c.fn, "topk_ids", "has top_k=0 columns; expected [T, top_k] with top_k >= 1");
  if (c.d.T * ids.dim(1) > kMaxInt)  // one CUDA block per route
    bad_value(c.fn, "topk_ids", "holds " + std::to_string(c.d.T * ids.dim(1)) + " routes, more than 2^31 - 1");
  c.d.topk_ids = ids.as<int32_t>();
  c.d.topk = static_cast<int>(ids.dim(1));
  c.d.num_experts = static_cast<int>(num_experts);
  c.d.capacity = static_cast<int>(capacity);
  std::vector<Tensor> out = launch_dispatch(c);
  pyb::dict d;
  d["x"] = out[0], d["inv_scale"] = out[1], d["counts"] = out[2], d["route_of_slot"] = out[3];
  return d;
}

pyb::object sparse_gemm(const pyb::object& x, const pyb::object& counts, const pyb::object& w,
                        const pyb::object& w_inv_gamma, int64_t M, const pyb::object& x_inv_scale,
                        const std::string& layout, const pyb::object& out, const pyb::object& out_dtype,
                        const pyb::object& max_tokens, const pyb::object& stream) {
  SparseGemmCall c;
  c.fn = "moesq.sparse_gemm";
  c.stream = parse_stream(stream, c.fn);
  ops::SparseGemmArgs& a = c.a;
  a.x_layout = parse_act_layout(layout, c.fn);
  std::optional<bool> want_bf16;
  if (!out_dtype.is_none()) {
    const std::string s = pyb::str(out_dtype);
    if (s == "float32" || s == "torch.float32") want_bf16 = false;
    else if (s == "bfloat16" || s == "torch.bfloat16") want_bf16 = true;
    else bad_value(c.fn, "out_dtype", "is " + s + ", not one of float32, bfloat16");
  }
  Views v(c);
  const DlView& xv = v.need(x, "x", kBf16, {-1, -1, -1});
  const int64_t E = xv.dim(0), cap = xv.dim(1), K_pad = xv.dim(2);
  if (E < 1 || E > 1024)  // the launcher's expert limit
    bad_value(c.fn, "x", "has E=" + std::to_string(E) + " experts, outside [1, 1024]");
  if (cap > kMaxInt) bad_value(c.fn, "x", "has capacity=" + std::to_string(cap) + ", more than 2^31 - 1");
  if (K_pad <= 0 || K_pad % format::kChunkK != 0)
    bad_value(c.fn, "x", "has K_pad=" + std::to_string(K_pad) + " columns; the kernel layout needs a positive multiple "
                         "of 256 (moesq.act_quant / moesq.dispatch pad K so)");
  const DlView& cv = v.need(counts, "counts", {DType::I32}, {E});
  const DlView& wv = v.need(w, "w", {DType::U8}, {E, -1, K_pad / format::kChunkK, format::kChunkBytes});
  const int64_t M_pad = wv.dim(1) * format::kMmaM;
  if (M_pad == 0) bad_value(c.fn, "w", "has no row tiles");
  if (M <= M_pad - format::kMmaM || M > M_pad)
    bad_value(c.fn, "M", "is " + std::to_string(M) + " but w holds M_pad=" + std::to_string(M_pad) +
                         " rows (M rounded up to 16): M must be in (" + std::to_string(M_pad - format::kMmaM) + ", " +
                         std::to_string(M_pad) + "]");
  const DlView& gv = v.need(w_inv_gamma, "w_inv_gamma", {DType::F32}, {E});
  const DlView* sv = v.maybe(x_inv_scale, "x_inv_scale", {DType::F32}, {E, cap});
  a.x = xv.as<uint16_t>(), a.counts = cv.as<int32_t>(), a.w = wv.as<uint8_t>(), a.w_inv_gamma = gv.as<float>();
  a.x_inv_scale = sv ? sv->as<float>() : nullptr;
  a.num_experts = static_cast<int>(E), a.capacity = static_cast<int>(cap);
  a.M = M, a.M_pad = M_pad, a.K_pad = K_pad, a.ldy = M;
  c.max_tokens = static_cast<int>(cap);
  if (!max_tokens.is_none()) {
    const int64_t mt = pyb::cast<int64_t>(max_tokens);
    check_range(c.fn, "max_tokens", mt, 0, cap);
    c.max_tokens = static_cast<int>(mt);
  }
  if (!out.is_none()) {
    const DlView& ov = v.need(out, "out", {DType::F32, DType::BF16}, {E, cap, M});
    c.out_bf16 = ov.dtype() == DType::BF16;
    if (want_bf16 && *want_bf16 != c.out_bf16)
      bad_value(c.fn, "out_dtype", std::string("is ") + (*want_bf16 ? "bfloat16" : "float32") + " but out is " +
                                       dtype_name(ov.dtype()));
    c.out_new = false;
    if (c.out_bf16) a.y = static_cast<uint16_t*>(ov.data());
    else a.y_f32 = static_cast<float*>(ov.data());
    launch_sparse_gemm(c);
    return out;
  }
  c.out_bf16 = want_bf16.value_or(false);
  return pyb::cast(launch_sparse_gemm(c).at(0));
}

// One MoE layer of a checkpoint: host weights read at construction (CPU), uploaded to a GPU once.
struct MoeLayerPy {
  std::string dir;
  std::shared_ptr<const runtime::HostMoeLayer> host;  // dropped after the upload
  io::ModelSpec spec;
  int64_t layer = 0;
  runtime::ExpertBackend backend = runtime::ExpertBackend::kBf16;
  std::string expert_format;
  bool act_quant = false;
  std::shared_ptr<MoeLayerDevice> dev;
  int device = -1;

  void upload(int to) {
    if (dev) {
      if (to != device)
        throw pyb::value_error("MoeLayer: the weights are on cuda:" + std::to_string(device) + "; got tensors on cuda:" +
                               std::to_string(to) + " (load another MoeLayer for that device)");
      return;
    }
    dev = upload_moe_layer(*host, to);
    device = to;
    host.reset();
  }
};

pyb::object moe_forward(MoeLayerPy& L, const pyb::object& x, const pyb::object& x_lo, const pyb::object& out,
                        bool accumulate, bool return_routes, const pyb::object& stream) {
  MoeForwardCall c;
  c.fn = "MoeLayer.forward";
  c.stream = parse_stream(stream, c.fn);
  if (accumulate && out.is_none())
    bad_value(c.fn, "accumulate", "is True but no out tensor is given to accumulate into (out += MoE(x))");
  Views v(c);
  const int64_t H = L.spec.hidden_size;
  const DlView& xv = v.need(x, "x", kBf16, {-1, H});
  const DlView* lo = v.maybe(x_lo, "x_lo", kBf16, {xv.dim(0), H});
  const DlView* ov = v.maybe(out, "out", {DType::F32}, {xv.dim(0), H});
  c.T = xv.dim(0), c.H = H, c.top_k = L.spec.top_k;
  if (c.T > (int64_t(1) << 20)) bad_value(c.fn, "x", "has T=" + std::to_string(c.T) + " rows, more than 2^20");
  c.x = xv.as<uint16_t>();
  c.x_lo = lo ? lo->as<uint16_t>() : nullptr;
  c.h = ov ? static_cast<float*>(ov->data()) : nullptr;
  c.accumulate = accumulate;
  c.routes = return_routes;
  L.upload(c.device);  // the first forward puts the weights on x's device
  std::vector<Tensor> r = launch_moe_layer(*L.dev, c);
  size_t i = 0;
  pyb::object y = ov ? out : pyb::cast(r.at(i++));
  if (!return_routes) return y;
  pyb::object ids = pyb::cast(r.at(i)), w = pyb::cast(r.at(i + 1));
  return pyb::make_tuple(y, ids, w);
}

}  // namespace

void register_gpu_ops(pyb::module_& m) {
  const auto none = pyb::none();
  m.def("act_quant", &act_quant, pyb::arg("x"), pyb::kw_only(), pyb::arg("x_lo") = none, pyb::arg("quantize") = true,
        pyb::arg("layout") = "mma-fragment", pyb::arg("stream") = none,
        R"(NVFP4 activation quantizer on the GPU, the one the engine's dispatch runs (ops/act_dispatch; CPU twin:
moesq.act_quant_ref, bitwise equal).

x: CUDA bfloat16 (or uint16 bf16 bits) [T, K], K a positive multiple of 32, C-contiguous, 16-byte aligned.
x_lo: None or CUDA bfloat16 [T, K] residues: the quantizer then reads the fp32 row x + x_lo (how the engine
  quantizes its near-fp32 rows; torch: hi = x32.bfloat16(); lo = (x32 - hi.float()).bfloat16()).
quantize: True NVFP4 (E2M1 codes, one UE4M3 scale per 32 values, per-token tensor scale γ_a = 448·6/amax,
  paper Eq. 5); False: the bf16 values only permuted (W4A16).
layout: "mma-fragment" (the mma.sp GEMM kernel) or "k-major" (the wgmma.sp kernel): the K order of the rows.
stream: the CUDA stream to run on (int handle, e.g. torch.cuda.current_stream().cuda_stream, or a
  torch.cuda.Stream); None: the legacy default stream. Inputs are taken via __dlpack__(stream=...).
Returns (rows, inv_scale): moesq.Tensor on x's device, rows bfloat16 [T, K_pad] (K_pad = K rounded up to 256,
  values dec(q)·dec(scale) exactly, zeros past K, in `layout` order), inv_scale float32 [T] = 1/γ_a (1 when
  quantize is False). View them with torch.from_dlpack (zero-copy).
Errors: TypeError (dtype, not a tensor, stream type), ValueError (shape, K, device, alignment, host memory
  claimed as CUDA, x_lo without quantize), moesq.Error (no GPU, CUDA failures).)");

  m.def("dispatch", &dispatch, pyb::arg("x"), pyb::arg("topk_ids"), pyb::arg("num_experts"), pyb::arg("capacity"),
        pyb::kw_only(), pyb::arg("x_lo") = none, pyb::arg("quantize") = true, pyb::arg("layout") = "mma-fragment",
        pyb::arg("stream") = none,
        R"(Routed rows → per-expert batches on the GPU, with the NVFP4 activation quantizer (ops/act_dispatch;
CPU twin: moesq.dispatch_ref, same rows per route).

x, x_lo, quantize, layout, stream: as moesq.act_quant. topk_ids: CUDA int32 [T, top_k], expert ids in
[0, num_experts) (ids outside are skipped on the device). Route r = t·top_k + j fills one slot of expert
topk_ids[t, j]; slots inside an expert are in the device's atomic (arrival) order and route_of_slot says
which route each holds; routes past `capacity` are counted and dropped.
Returns a dict of moesq.Tensor on x's device: x bfloat16 [E, capacity, K_pad], inv_scale float32
[E, capacity] (1/γ_a), counts int32 [E] (routes per expert, may exceed capacity), route_of_slot int32
[E, capacity] (−1 where empty; empty slots have x = 0, inv_scale = 0).
Errors: as moesq.act_quant, and ValueError for num_experts outside [1, 65536] or capacity < 0.)");

  m.def("sparse_gemm", &sparse_gemm, pyb::arg("x"), pyb::arg("counts"), pyb::arg("w"), pyb::arg("w_inv_gamma"),
        pyb::arg("M"), pyb::kw_only(), pyb::arg("x_inv_scale") = none, pyb::arg("layout") = "mma-fragment",
        pyb::arg("out") = none, pyb::arg("out_dtype") = none, pyb::arg("max_tokens") = none, pyb::arg("stream") = none,
        R"(Grouped sparse GEMM on the GPU over routed rows, paired 4:8 NVFP4 weights on Hopper sparse tensor cores
(ops/sparse_gemm; CPU twin: moesq.sparse_gemm_ref on the same bits):
  y[e, slot, m] = (1/γ_w[e])·(1/γ_a[e, slot]) · Σ_k Ŵ_e[m, k]·X̂_e[slot, k]   for slot < min(counts[e], capacity)
(paper §3.4: Y_eᵀ = W_e X_eᵀ, W on the sparse operand; fp32 accumulation).

x: CUDA bfloat16 [E, capacity, K_pad] in `layout` K order (moesq.dispatch's x), E <= 1024, K_pad % 256 == 0.
counts: CUDA int32 [E] (clamped to capacity). w: CUDA uint8 [E, M_pad/16, K_pad/256, 1408], the kernel
layout (moesq.KernelWeights.packed); w_inv_gamma: CUDA float32 [E] 1/γ_w (KernelWeights.inv_gamma).
M: logical output rows, M_pad − 16 < M <= M_pad. x_inv_scale: CUDA float32 [E, capacity] 1/γ_a (W4A4,
from dispatch(quantize=True)), or None (W4A16: x holds bf16 activations, dispatch(quantize=False)).
layout: the K order of x; the kernel the heuristic picks is used when it reads that layout, otherwise a
built kernel that does (moesq.sparse_gemm_config says which layout is fastest). max_tokens: an upper
bound on every count, for the tile choice (default capacity; slots of a count above it are not computed).
out: None → a new moesq.Tensor [E, capacity, M] of out_dtype ("float32" default or "bfloat16"), zero in
slots past the count; or a CUDA float32/bfloat16 tensor [E, capacity, M] written in place (other slots
untouched) and returned. stream: as moesq.act_quant.
Errors: TypeError / ValueError naming the argument (dtype, shape, device, alignment, M, max_tokens,
out_dtype), moesq.Error (no GPU, CUDA failures).)");

  m.def(
      "sparse_gemm_config",
      [](int64_t num_experts, int64_t M, int64_t K_pad, int64_t max_tokens, int device) {
        const std::string fn = "moesq.sparse_gemm_config";
        check_range(fn, "num_experts", num_experts, 1, 1024);
        check_range(fn, "M", M, 1, kMaxInt);
        if (K_pad <= 0 || K_pad % format::kChunkK != 0) bad_value(fn, "K_pad", "must be a positive multiple of 256");
        check_range(fn, "max_tokens", max_tokens, 0, kMaxInt);
        const auto [layout, config] = sparse_gemm_config(device, static_cast<int>(num_experts), M, K_pad,
                                                         static_cast<int>(max_tokens));
        pyb::dict d;
        d["layout"] = layout, d["config"] = config;
        return d;
      },
      pyb::arg("num_experts"), pyb::arg("M"), pyb::arg("K_pad"), pyb::arg("max_tokens"), pyb::arg("device") = 0,
      "The grouped sparse GEMM's tile heuristic for a problem on CUDA `device`: {'layout': the activation layout "
      "its kernel reads ('mma-fragment' | 'k-major', pass it to dispatch / act_quant / sparse_gemm), 'config': the "
      "printable tile config}");

  pyb::class_<MoeLayerPy>(m, "MoeLayer",
                          "One MoE layer of a checkpoint on the GPU (runtime::MoeLayerGpu, the engine's expert block)")
      .def(pyb::init([](const std::string& dir, int64_t layer, const std::string& experts) {
             auto L = std::make_unique<MoeLayerPy>();
             L->dir = dir;
             {
               pyb::gil_scoped_release nogil;
               const io::Checkpoint ck(dir);
               L->host = std::make_shared<const runtime::HostMoeLayer>(
                   runtime::load_host_moe_layer(ck, layer, runtime::parse_expert_backend(experts)));
             }
             L->spec = L->host->spec, L->layer = layer, L->backend = L->host->backend;
             L->expert_format = io::expert_storage_name(L->host->expert_storage), L->act_quant = L->host->act_quant;
             return L;
           }),
           pyb::arg("dir"), pyb::arg("layer"), pyb::arg("experts") = "auto",
           "Reads layer `layer`'s router (bf16) and routed experts from checkpoint `dir` (qwen3_moe; bf16 or moesq "
           "paired 4:8) on the CPU. experts: auto (the checkpoint's: paired 4:8 → sparse-w4a4, bf16 → bf16), bf16, "
           "sparse-w4a4, sparse-w4a16. Weights go to the GPU on .to(device) or the first forward. Errors: moesq.Error "
           "naming the directory, tensor, layer or backend")
      .def_readonly("dir", &MoeLayerPy::dir)
      .def_readonly("layer", &MoeLayerPy::layer)
      .def_property_readonly("hidden_size", [](const MoeLayerPy& L) { return L.spec.hidden_size; })
      .def_property_readonly("num_experts", [](const MoeLayerPy& L) { return L.spec.num_experts; })
      .def_property_readonly("top_k", [](const MoeLayerPy& L) { return L.spec.top_k; })
      .def_property_readonly("backend", [](const MoeLayerPy& L) { return runtime::expert_backend_name(L.backend); })
      .def_readonly("expert_format", &MoeLayerPy::expert_format)
      .def_readonly("act_quant", &MoeLayerPy::act_quant, "True: NVFP4 expert activations (sparse-w4a4)")
      .def_property_readonly("device",
                             [](const MoeLayerPy& L) -> pyb::object {
                               return L.dev ? pyb::object(pyb::int_(L.device)) : pyb::object(pyb::none());
                             },
                             "CUDA device of the weights, None before the upload")
      .def_property_readonly("weight_bytes",
                             [](const MoeLayerPy& L) -> size_t { return L.dev ? moe_layer_weight_bytes(*L.dev) : 0; },
                             "device bytes of the uploaded router and expert weights (0 before the upload)")
      .def(
          "to",
          [](MoeLayerPy& L, int device) -> MoeLayerPy& {
            if (device < 0) bad_value("MoeLayer.to", "device", "is " + std::to_string(device) + "; expected >= 0");
            L.upload(device);
            return L;
          },
          pyb::arg("device") = 0, pyb::return_value_policy::reference_internal,
          "Uploads the weights to CUDA `device` (synchronously, once); returns self")
      .def("forward", &moe_forward, pyb::arg("x"), pyb::kw_only(), pyb::arg("x_lo") = none, pyb::arg("out") = none,
           pyb::arg("accumulate") = false, pyb::arg("return_routes") = false, pyb::arg("stream") = none,
           R"(The layer's routed-expert block on the GPU, as the engine runs it: router GEMM (fp32 logits) → softmax →
top-k → renormalize (norm_topk_prob) → dispatch (+ NVFP4 act quant for sparse-w4a4) → gate|up grouped GEMM →
SwiGLU (+ requant) → down grouped GEMM → combine in ascending expert order (fixed order, no atomics).
CPU reference: moesq.load(dir).moe_layer(layer, x + x_lo).

x: CUDA bfloat16 [T, H] (the MoE input, after post_attention_layernorm), x_lo: None or CUDA bfloat16 [T, H]
residues so that x + x_lo carries an fp32 row (as the engine's rmsnorm gives; torch: hi = x32.bfloat16();
lo = (x32 - hi.float()).bfloat16()); the router GEMM and the W4A4 quantizer read x + x_lo.
out: None → a new float32 [T, H] moesq.Tensor y; or a CUDA float32 [T, H] tensor: out = y, or out += y with
accumulate=True (the residual add). return_routes: also return topk_ids int32 [T, top_k] (descending
probability) and topk_w float32 [T, top_k]. stream: as moesq.act_quant.
Returns y (or out), or (y, topk_ids, topk_w). The first call uploads the weights to x's device.
Errors: TypeError / ValueError naming the argument (dtype, shape, device, alignment, accumulate without
out, a device other than the weights'), moesq.Error (no GPU, CUDA failures).)")
      .def("__call__", &moe_forward, pyb::arg("x"), pyb::kw_only(), pyb::arg("x_lo") = none, pyb::arg("out") = none,
           pyb::arg("accumulate") = false, pyb::arg("return_routes") = false, pyb::arg("stream") = none,
           "Same as forward")
      .def("__repr__", [](const MoeLayerPy& L) {
        return "moesq.MoeLayer(dir='" + L.dir + "', layer=" + std::to_string(L.layer) +
               ", backend=" + runtime::expert_backend_name(L.backend) +
               ", device=" + (L.dev ? "cuda:" + std::to_string(L.device) : std::string("None")) + ")";
      });
}

}  // namespace moesq::py

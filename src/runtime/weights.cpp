// Host weights of the GPU engine (weights.h).
#include "runtime/weights.h"

#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "format/nvfp4.h"
#include "format/packed_weight.h"
#include "io/compressed_checkpoint.h"
#include "io/import_checkpoint.h"

namespace moesq::runtime {

namespace {

std::string lname(int64_t l, const std::string& rest) { return "model.layers." + std::to_string(l) + "." + rest; }
std::string ename(int64_t l, int64_t e, const char* proj) {
  return lname(l, "mlp.experts." + std::to_string(e) + "." + proj);
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}

void append_bf16(std::vector<uint16_t>& dst, const std::vector<float>& v) {
  for (float f : v) dst.push_back(f32_to_bf16(f));
}

// One projection as paired 4:8 NVFP4, from any layout io reads (moesq, compressed-tensors NVFP4 whose
// data is paired, pair-bitmask): io::read_packed_weight gives the canonical Sparse48Tensor, so every
// layout uploads the same bytes. Error naming the tensor for a dense-NVFP4 projection.
format::Sparse48Tensor read_sparse48(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, const std::string& p,
                                     int64_t N, int64_t K) {
  MOESQ_CHECK(io::has_packed_projection(ckpt, p), "tensor ", p, ".weight_packed not found in ", ckpt.dir(),
              " (a paired-4:8 backend needs a paired-4:8-nvfp4 checkpoint)");
  format::PackedWeight w = io::read_packed_weight(ckpt, q, p, N, K);
  MOESQ_CHECK(w.is_sparse48(), "tensor ", p, " in ", ckpt.dir(), " is dense NVFP4, not paired 4:8: the paired-4:8 "
              "backends need every projection paired (use --experts bf16)");
  return *w.sparse48();  // γ already checked by io's global-scale readers (check_stored_tensor_scale)
}

// gate [I, H] and up [I, H] → one [2I, H] tensor (gate rows first); both must share γ (FORMAT.md).
format::Sparse48Tensor fuse_rows(const format::Sparse48Tensor& g, const format::Sparse48Tensor& u,
                                 const std::string& where) {
  MOESQ_CHECK(g.global_scale == u.global_scale, where, ": gate_proj and up_proj have different weight_global_scale (",
              g.global_scale, " vs ", u.global_scale, "); the fused gate|up GEMM needs one (docs/FORMAT.md)");
  format::Sparse48Tensor f = g;
  f.N = g.N + u.N;
  f.values.insert(f.values.end(), u.values.begin(), u.values.end());
  f.meta.insert(f.meta.end(), u.meta.begin(), u.meta.end());
  f.scales.insert(f.scales.end(), u.scales.begin(), u.scales.end());
  return f;
}

void check_model_type(const io::Checkpoint& ckpt) {
  MOESQ_CHECK(ckpt.spec().model_type == "qwen3_moe", ckpt.dir(), ": model_type \"", ckpt.spec().model_type,
              "\" is not qwen3_moe (the GPU engine runs qwen3_moe)");
}

// The engine's name for a checkpoint's expert format, from io::read_quantization_config (moesq,
// compressed-tensors NVFP4 / pair-bitmask / pack-quantized INT4): "bf16", "paired-4:8-nvfp4", "nvfp4"
// or "int4". A compressed-tensors NVFP4 file says whether it is paired only through its data: the first
// MoE layer's expert 0 gate_proj decides, and read_sparse48 refuses any projection that disagrees.
// A half-compressed checkpoint is refused as the CPU loader refuses it (io::check_expert_storage).
std::string checkpoint_format(const io::Checkpoint& ckpt, const io::QuantizationConfig& q) {
  io::check_expert_storage(ckpt, q, false);
  switch (q.storage) {
    case io::ExpertStorage::Dense: return "bf16";
    case io::ExpertStorage::Int4: return "int4";
    case io::ExpertStorage::Sparse48: return "paired-4:8-nvfp4";
    case io::ExpertStorage::Nvfp4: break;
  }
  if (q.layout == io::CheckpointLayout::Moesq) return "nvfp4";
  const io::ModelSpec& s = ckpt.spec();
  int64_t l = 0;
  while (l + 1 < s.num_layers && !s.is_moe_layer(l)) ++l;
  const std::string p = ename(l, 0, "gate_proj");
  if (!io::has_packed_projection(ckpt, p)) return "nvfp4";
  return io::read_packed_weight(ckpt, q, p, s.moe_intermediate_size, s.hidden_size).is_sparse48() ? "paired-4:8-nvfp4"
                                                                                                  : "nvfp4";
}

// The router and routed experts of MoE layer l into L (router, gu_*/down_* per `backend`).
void load_moe_weights(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, ExpertBackend backend, int64_t l,
                      HostLayer& L) {
  const io::ModelSpec& s = ckpt.spec();
  const int64_t H = s.hidden_size, E = s.num_experts, I = s.moe_intermediate_size;
  const int64_t H_pad = format::padded_k(H), I_pad = format::padded_k(I);
  L.router = to_bf16(ckpt.get_f32(lname(l, "mlp.gate.weight"), {E, H}));
  if (backend == ExpertBackend::kBf16) {
    L.gu_dense.assign(E * 2 * I * H_pad, 0);
    L.down_dense.assign(E * H * I_pad, 0);
    for (int64_t e = 0; e < E; ++e) {
      // Any layout io reads, dequantized exactly (io::read_expert_weight_f32: .weight, NVFP4, INT4).
      const std::vector<float> g = io::read_expert_weight_f32(ckpt, q, ename(l, e, "gate_proj"), I, H);
      const std::vector<float> u = io::read_expert_weight_f32(ckpt, q, ename(l, e, "up_proj"), I, H);
      const std::vector<float> d = io::read_expert_weight_f32(ckpt, q, ename(l, e, "down_proj"), H, I);
      permute_dense_rows(g.data(), I, H, H_pad, &L.gu_dense[(e * 2 * I) * H_pad]);
      permute_dense_rows(u.data(), I, H, H_pad, &L.gu_dense[(e * 2 * I + I) * H_pad]);
      permute_dense_rows(d.data(), H, I, I_pad, &L.down_dense[e * H * I_pad]);
    }
  } else {
    std::vector<format::Sparse48Tensor> gu(E), down(E);
    std::vector<const format::Sparse48Tensor*> pgu(E), pdown(E);
    for (int64_t e = 0; e < E; ++e) {
      gu[e] = fuse_rows(read_sparse48(ckpt, q, ename(l, e, "gate_proj"), I, H),
                        read_sparse48(ckpt, q, ename(l, e, "up_proj"), I, H), ename(l, e, "gate_proj|up_proj"));
      down[e] = read_sparse48(ckpt, q, ename(l, e, "down_proj"), H, I);
      pgu[e] = &gu[e];
      pdown[e] = &down[e];
    }
    L.gu_sparse = format::kernel_layout_from_sparse48(pgu, lname(l, "mlp.experts.gate_up"));
    L.down_sparse = format::kernel_layout_from_sparse48(pdown, lname(l, "mlp.experts.down"));
  }
}

}  // namespace

io::ModelSpec synthetic_spec(const std::string& name, int64_t layers) {
  io::ModelSpec s;
  s.model_type = "qwen3_moe";
  s.vocab_size = 151936, s.head_dim = 128, s.top_k = 8, s.num_experts = 128, s.norm_topk_prob = true;
  s.rms_norm_eps = 1e-6, s.rope_theta = 1000000.0, s.max_position_embeddings = 40960;
  if (name == "qwen3-30b-a3b") {
    s.hidden_size = 2048, s.num_layers = 48, s.num_heads = 32, s.num_kv_heads = 4, s.moe_intermediate_size = 768;
    s.intermediate_size = 6144;
  } else if (name == "qwen3-235b-a22b") {
    s.hidden_size = 4096, s.num_layers = 94, s.num_heads = 64, s.num_kv_heads = 4, s.moe_intermediate_size = 1536;
    s.intermediate_size = 12288;
  } else {
    MOESQ_FAIL("--synthetic: \"", name, "\" is not one of qwen3-30b-a3b, qwen3-235b-a22b");
  }
  MOESQ_CHECK(layers >= 0 && layers <= s.num_layers, "--layers: ", layers, " not in [0, ", s.num_layers, "]");
  if (layers > 0) s.num_layers = layers;
  return s;
}

void permute_dense_rows(const float* w, int64_t N, int64_t K, int64_t K_pad, uint16_t* out) {
  for (int64_t n = 0; n < N; ++n) {
    uint16_t* o = out + n * K_pad;
    for (int64_t k = 0; k < K_pad; ++k) o[k] = 0;
    for (int64_t k = 0; k < K; ++k) o[format::act_storage_index(k, format::ActLayout::kKMajor)] = f32_to_bf16(w[n * K + k]);
  }
}

ExpertBackend resolve_backend(ExpertBackend requested, const std::string& fmt) {
  ExpertBackend b = requested;
  if (b == ExpertBackend::kAuto) {
    if (fmt == "paired-4:8-nvfp4") b = ExpertBackend::kSparseW4A4;
    else if (fmt == "nvfp4") b = ExpertBackend::kNvfp4W4A16;
    else b = ExpertBackend::kBf16;
  }
  require_built(b);
  if (b == ExpertBackend::kSparseW4A4 || b == ExpertBackend::kSparseW4A16)
    MOESQ_CHECK(fmt == "paired-4:8-nvfp4", "expert backend ", expert_backend_name(b),
                " needs a paired-4:8-nvfp4 checkpoint (moesq compress ...); this one has ", fmt,
                " experts (use --experts bf16)");
  return b;
}

HostModel load_host_model(const io::Checkpoint& ckpt, ExpertBackend requested) {
  HostModel m;
  m.spec = ckpt.spec();
  const io::ModelSpec& s = m.spec;
  check_model_type(ckpt);
  const io::QuantizationConfig q = io::read_quantization_config(ckpt);
  m.expert_format = checkpoint_format(ckpt, q);
  m.backend = resolve_backend(requested, m.expert_format);
  m.act_quant = m.backend == ExpertBackend::kSparseW4A4;
  m.act_block = m.act_quant ? format::kSparseScaleBlock : 0;
  const int64_t H = s.hidden_size, V = s.vocab_size, hd = s.head_dim;
  const int64_t nh = s.num_heads, nkv = s.num_kv_heads;
  m.embed = to_bf16(ckpt.get_f32("model.embed_tokens.weight", {V, H}));
  m.final_norm = ckpt.get_f32("model.norm.weight", {H});
  if (ckpt.has("lm_head.weight")) {
    m.lm_head = to_bf16(ckpt.get_f32("lm_head.weight", {V, H}));
  } else {
    MOESQ_CHECK(s.tie_word_embeddings, "tensor lm_head.weight not found in ", ckpt.dir(),
                " and tie_word_embeddings is false");
    m.lm_head = m.embed;
  }
  m.layers.resize(s.num_layers);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    MOESQ_CHECK(s.is_moe_layer(l), ckpt.dir(), ": layer ", l,
                " is a dense MLP layer (mlp_only_layers / decoder_sparse_step); the GPU engine runs MoE layers only");
    HostLayer& L = m.layers[l];
    auto get = [&](const std::string& rest, const std::vector<int64_t>& shape) {
      return ckpt.get_f32(lname(l, rest), shape);
    };
    L.input_norm = get("input_layernorm.weight", {H});
    L.post_norm = get("post_attention_layernorm.weight", {H});
    L.q_norm = get("self_attn.q_norm.weight", {hd});
    L.k_norm = get("self_attn.k_norm.weight", {hd});
    append_bf16(L.qkv, get("self_attn.q_proj.weight", {nh * hd, H}));
    append_bf16(L.qkv, get("self_attn.k_proj.weight", {nkv * hd, H}));
    append_bf16(L.qkv, get("self_attn.v_proj.weight", {nkv * hd, H}));
    L.o = to_bf16(get("self_attn.o_proj.weight", {H, nh * hd}));
    load_moe_weights(ckpt, q, m.backend, l, L);
  }
  return m;
}

HostMoeLayer load_host_moe_layer(const io::Checkpoint& ckpt, int64_t layer, ExpertBackend requested) {
  HostMoeLayer m;
  m.spec = ckpt.spec();
  check_model_type(ckpt);
  MOESQ_CHECK(layer >= 0 && layer < m.spec.num_layers, ckpt.dir(), ": layer ", layer, " outside [0, ",
              m.spec.num_layers, ")");
  MOESQ_CHECK(m.spec.is_moe_layer(layer), ckpt.dir(), ": layer ", layer,
              " is a dense MLP layer (mlp_only_layers / decoder_sparse_step), not a MoE layer");
  m.layer = layer;
  const io::QuantizationConfig q = io::read_quantization_config(ckpt);
  m.expert_format = checkpoint_format(ckpt, q);
  m.backend = resolve_backend(requested, m.expert_format);
  m.act_quant = m.backend == ExpertBackend::kSparseW4A4;
  load_moe_weights(ckpt, q, m.backend, layer, m.weights);
  return m;
}

}  // namespace moesq::runtime

// Loads a qwen3_moe checkpoint into Qwen3Moe: HF tensor names (docs/FORMAT.md), every
// shape checked against the spec with an error naming the tensor and the directory.
//
// Routed experts come either as HF `.weight` tensors (bf16/f16/f32) or as a moesq compressed
// checkpoint (`.weight_packed` + scales, config.json `quantization_config`). Compressed experts are
// decoded once to their exact dequantized fp32 values (ŵ = dec(q)·dec(c_b)/γ is exact in fp32),
// so the forward is the same code for both; the decision that matters is that loading a compressed
// checkpoint makes W4A4 (act_quant with the format's block size) its default_forward_options(): a W4A4 deployment quantizes
// activations too, and evaluating it W4A16 would flatter it.
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/nvfp4.h"
#include "io/tensor_names.h"
#include "model/qwen3_moe.h"

namespace moesq::model {

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

enum class ExpertFormat { Dense, Sparse48, Nvfp4 };

struct QuantInfo {
  ExpertFormat format = ExpertFormat::Dense;
  std::string format_name = "bf16";
  int act_block = format::kActScaleBlock;
};

QuantInfo read_quant_info(const io::Checkpoint& ckpt) {
  QuantInfo q;
  const auto& cfg = ckpt.config();
  if (!cfg.contains("quantization_config")) return q;
  const auto& qc = cfg["quantization_config"];
  const std::string where = ckpt.dir() + "/config.json quantization_config";
  MOESQ_CHECK(qc.is_object() && qc.contains("format") && qc["format"].is_string(), where,
              ": missing string key \"format\"");
  q.format_name = qc["format"].get<std::string>();
  if (q.format_name == "paired-4:8-nvfp4") {
    q.format = ExpertFormat::Sparse48;
    q.act_block = format::kSparseScaleBlock;
  } else if (q.format_name == "nvfp4") {
    q.format = ExpertFormat::Nvfp4;
    q.act_block = format::kDenseScaleBlock;
  } else {
    MOESQ_FAIL(where, ": unknown format \"", q.format_name,
               "\" (expected \"paired-4:8-nvfp4\" or \"nvfp4\")");
  }
  if (qc.contains("input_activations") && qc["input_activations"].is_object() &&
      qc["input_activations"].contains("block_size")) {
    const auto& b = qc["input_activations"]["block_size"];
    MOESQ_CHECK(b.is_number_integer() && (b.get<int>() == 16 || b.get<int>() == 32), where,
                ": input_activations.block_size must be 16 or 32");
    q.act_block = b.get<int>();
  }
  return q;
}

// Raw bytes of a U8 / F8_E4M3 tensor with the expected dtype and shape.
std::vector<uint8_t> get_bytes(const io::Checkpoint& ckpt, const std::string& name, io::DType dtype,
                               const std::vector<int64_t>& shape) {
  const io::TensorView& t = ckpt.get(name);
  MOESQ_CHECK(t.dtype == dtype, "tensor ", name, " in ", ckpt.dir(), " has dtype ",
              io::dtype_name(t.dtype), ", expected ", io::dtype_name(dtype));
  MOESQ_CHECK(t.shape == shape, "tensor ", name, " in ", ckpt.dir(), " has shape ", t.shape_str(),
              ", expected ", shape_str(shape));
  return std::vector<uint8_t>(t.data, t.data + t.nbytes);
}

float get_global_scale(const io::Checkpoint& ckpt, const std::string& name) {
  const std::vector<float> g = ckpt.get_f32(name, {1});
  MOESQ_CHECK(std::isfinite(g[0]) && g[0] > 0.0f, "tensor ", name, " in ", ckpt.dir(),
              " holds global scale ", g[0], ", expected a finite value > 0");
  return g[0];
}

// One expert projection W [N, K] → fp32, from whichever representation the checkpoint holds.
std::vector<float> load_projection(const io::Checkpoint& ckpt, const QuantInfo& q,
                                   const std::string& prefix, int64_t N, int64_t K) {
  if (ckpt.has(prefix + io::kWeight)) return ckpt.get_f32(prefix + io::kWeight, {N, K});
  MOESQ_CHECK(ckpt.has(prefix + io::kWeightPacked), "tensor ", prefix, ".weight (or ", prefix,
              ".weight_packed) not found in ", ckpt.dir());
  MOESQ_CHECK(q.format != ExpertFormat::Dense, "tensor ", prefix, ".weight_packed in ", ckpt.dir(),
              " but config.json has no quantization_config");
  std::vector<float> W(N * K);
  if (q.format == ExpertFormat::Sparse48) {
    MOESQ_CHECK(K % format::kSparseScaleBlock == 0, "tensor ", prefix, ": K = ", K,
                " is not a multiple of ", format::kSparseScaleBlock);
    format::Sparse48Tensor t;
    t.N = N;
    t.K = K;
    t.values = get_bytes(ckpt, prefix + io::kWeightPacked, io::DType::U8, {N, K / 4});
    t.meta = get_bytes(ckpt, prefix + io::kWeightMeta, io::DType::U8, {N, K / 16});
    t.scales = get_bytes(ckpt, prefix + io::kWeightScale, io::DType::F8_E4M3, {N, K / 32});
    t.global_scale = get_global_scale(ckpt, prefix + io::kWeightGlobalScale);
    format::sparse48_dequantize(t, W.data());
  } else {
    MOESQ_CHECK(K % format::kDenseScaleBlock == 0, "tensor ", prefix, ": K = ", K,
                " is not a multiple of ", format::kDenseScaleBlock);
    format::Nvfp4Tensor t;
    t.N = N;
    t.K = K;
    t.values = get_bytes(ckpt, prefix + io::kWeightPacked, io::DType::U8, {N, K / 2});
    t.scales = get_bytes(ckpt, prefix + io::kWeightScale, io::DType::F8_E4M3, {N, K / 16});
    t.global_scale = get_global_scale(ckpt, prefix + io::kWeightGlobalScale);
    format::nvfp4_dequantize(t, W.data());
  }
  return W;
}

}  // namespace

class ModelLoader {
 public:
  static void load(Qwen3Moe& m, const io::Checkpoint& ckpt) {
    const io::ModelSpec& s = m.spec_;
    MOESQ_CHECK(s.model_type == "qwen3_moe", ckpt.dir(), ": model_type \"", s.model_type,
                "\" is not qwen3_moe");
    const int64_t H = s.hidden_size, V = s.vocab_size, hd = s.head_dim, E = s.num_experts,
                  I = s.moe_intermediate_size;
    const QuantInfo q = read_quant_info(ckpt);

    m.embed_ = ckpt.get_f32(io::kEmbedTokens, {V, H});
    m.final_norm_ = ckpt.get_f32(io::kFinalNorm, {H});
    if (ckpt.has(io::kLmHead)) {
      m.lm_head_ = ckpt.get_f32(io::kLmHead, {V, H});
    } else {
      MOESQ_CHECK(s.tie_word_embeddings, "tensor lm_head.weight not found in ", ckpt.dir(),
                  " and tie_word_embeddings is false");
      m.lm_head_ = m.embed_;
    }
    bool any_packed = false;
    for (int64_t l = 0; l < s.num_layers; ++l) {
      LayerWeights& L = m.layers_[l];
      auto get = [&](const std::string& rest, const std::vector<int64_t>& shape) {
        return ckpt.get_f32(io::layer_tensor(l, rest), shape);
      };
      L.input_norm = get("input_layernorm.weight", {H});
      L.q_proj = get("self_attn.q_proj.weight", {s.num_heads * hd, H});
      L.k_proj = get("self_attn.k_proj.weight", {s.num_kv_heads * hd, H});
      L.v_proj = get("self_attn.v_proj.weight", {s.num_kv_heads * hd, H});
      L.o_proj = get("self_attn.o_proj.weight", {H, s.num_heads * hd});
      L.q_norm = get("self_attn.q_norm.weight", {hd});
      L.k_norm = get("self_attn.k_norm.weight", {hd});
      L.post_norm = get("post_attention_layernorm.weight", {H});
      if (!s.is_moe_layer(l)) {
        const int64_t Id = s.intermediate_size;
        L.dense_mlp.gate = get("mlp.gate_proj.weight", {Id, H});
        L.dense_mlp.up = get("mlp.up_proj.weight", {Id, H});
        L.dense_mlp.down = get("mlp.down_proj.weight", {H, Id});
        continue;
      }
      L.router = get("mlp.gate.weight", {E, H});
      for (int64_t e = 0; e < E; ++e) {
        ExpertWeights& W = L.experts[e];
        for (const char* proj : io::kExpertProjNames)
          if (ckpt.has(io::expert_tensor_prefix(l, e, proj) + io::kWeightPacked)) any_packed = true;
        W.gate = load_projection(ckpt, q, io::expert_tensor_prefix(l, e, io::ExpertProj::Gate), I, H);
        W.up = load_projection(ckpt, q, io::expert_tensor_prefix(l, e, io::ExpertProj::Up), I, H);
        W.down = load_projection(ckpt, q, io::expert_tensor_prefix(l, e, io::ExpertProj::Down), H, I);
      }
    }
    if (q.format != ExpertFormat::Dense) {
      MOESQ_CHECK(any_packed, ckpt.dir(), "/config.json declares quantization_config format \"",
                  q.format_name, "\" but no expert has a .weight_packed tensor");
      m.default_options_.act_quant = true;
      m.default_options_.act_block = q.act_block;
      m.expert_format_ = q.format_name;
    }
  }
};

Qwen3Moe::Qwen3Moe(const io::Checkpoint& ckpt) : Qwen3Moe(ckpt.spec()) { ModelLoader::load(*this, ckpt); }

}  // namespace moesq::model

// Loads a qwen3_moe checkpoint into Qwen3Moe: HF tensor names (docs/FORMAT.md), every
// shape checked against the spec with an error naming the tensor and the directory.
//
// Routed experts come either as HF `.weight` tensors (bf16/f16/f32) or as a moesq compressed
// checkpoint (read by io/compressed_checkpoint.h). Compressed experts are decoded once to their exact
// dequantized fp32 values (ŵ = dec(q)·dec(c_b)/γ is exact in fp32), so the forward is the same code
// for both; the decision that matters is that a compressed checkpoint's default_forward_options()
// is W4A4 (act_quant with the format's block size): a W4A4 deployment quantizes activations too,
// and evaluating it W4A16 would flatter it.
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/compressed_checkpoint.h"
#include "io/import_checkpoint.h"
#include "model/qwen3_moe.h"

namespace moesq::model {

namespace {

// One expert projection W [N, K] → fp32, from whichever representation the checkpoint holds
// (io/import_checkpoint.h: HF .weight, moesq or compressed-tensors NVFP4, INT4). Counts paired 4:8
// and dense NVFP4 tensors: a compressed-tensors checkpoint says which it is only through its data.
struct PackedCount {
  int64_t sparse48 = 0, nvfp4 = 0;
};
std::vector<float> load_projection(const io::Checkpoint& ckpt, const io::QuantizationConfig& q,
                                   const std::string& prefix, int64_t N, int64_t K, PackedCount& count) {
  io::ExpertStorage st = io::ExpertStorage::Dense;
  std::vector<float> w = io::read_expert_weight_f32(ckpt, q, prefix, N, K, &st);
  count.sparse48 += st == io::ExpertStorage::Sparse48;
  count.nvfp4 += st == io::ExpertStorage::Nvfp4;
  return w;
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
    const io::QuantizationConfig q = io::read_quantization_config(ckpt);

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
    PackedCount count;
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
          if (io::has_packed_projection(ckpt, io::expert_tensor_prefix(l, e, proj))) any_packed = true;
        W.gate = load_projection(ckpt, q, io::expert_tensor_prefix(l, e, io::ExpertProj::Gate), I, H, count);
        W.up = load_projection(ckpt, q, io::expert_tensor_prefix(l, e, io::ExpertProj::Up), I, H, count);
        W.down = load_projection(ckpt, q, io::expert_tensor_prefix(l, e, io::ExpertProj::Down), H, I, count);
      }
    }
    if (q.storage != io::ExpertStorage::Dense) {
      MOESQ_CHECK(any_packed, ckpt.dir(), "/config.json declares quantization_config format \"",
                  q.format_name, "\" but no expert has a .weight_packed tensor");
      m.default_options_.act_quant = q.act_quant && q.storage != io::ExpertStorage::Int4;
      m.default_options_.act_block = q.act_block;
      m.expert_format_ = q.format_name;
      if (q.layout != io::CheckpointLayout::Moesq && q.storage != io::ExpertStorage::Int4) {
        // compressed-tensors NVFP4: all experts paired 4:8 → moesq's deployment (block 32); else dense.
        const bool sparse = count.nvfp4 == 0 && count.sparse48 > 0;
        m.expert_format_ = sparse ? "paired-4:8-nvfp4" : "nvfp4";
        m.default_options_.act_block = sparse ? format::kSparseScaleBlock : format::kDenseScaleBlock;
      } else if (q.storage == io::ExpertStorage::Int4) {
        m.expert_format_ = "int4-pack-quantized";
      }
    }
  }
};

Qwen3Moe::Qwen3Moe(const io::Checkpoint& ckpt) : Qwen3Moe(ckpt.spec()) { ModelLoader::load(*this, ckpt); }

}  // namespace moesq::model

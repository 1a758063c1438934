// Host side of the attention block (attention_block.h).
#include "runtime/layers/attention_block.h"

#include "core/half.h"
#include "io/tensor_names.h"
#include "io/tensor_names_families.h"
#include "model/families.h"

namespace moesq::runtime {

std::string attention_block_refusal(const io::ModelSpec& s) {
  const model::ModelFamily* f = model::find_model_family(s.model_type);
  if (!f) return "moesq has no forward for it";
  if (f->make_mixer) return "its token mixer is not the built-in GQA attention";
  std::string why;
  auto no = [&](bool bad, const char* what) {
    if (bad) why += (why.empty() ? "" : ", ") + std::string(what);
  };
  no(s.attention_bias, "its o_proj has a bias (attention_bias)");
  no(s.head_dim != 32 && s.head_dim != 64 && s.head_dim != 128, "its head_dim is not 32, 64 or 128");
  const int64_t G = s.num_kv_heads > 0 ? s.num_heads / s.num_kv_heads : 0;
  no(G != 1 && G != 2 && G != 4 && G != 8 && G != 16, "its query heads per kv head are not 1, 2, 4, 8 or 16");
  no(s.rms_norm_unit_offset, "its RMSNorm weights are zero-centred");
  no(s.has_sliding_window(), "it uses sliding-window attention (use_sliding_window), which the GPU attention is not built for");
  return why;
}

HostAttention load_host_attention(const io::Checkpoint& ckpt, int64_t l) {
  namespace names = io::family_names;
  const io::ModelSpec& s = ckpt.spec();
  const int64_t H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
  auto get = [&](const std::string& rest, const std::vector<int64_t>& shape) {
    return ckpt.get_f32(io::layer_tensor(l, rest), shape);
  };
  auto proj = [&](const char* p) { return std::string(names::kAttn) + p + io::kWeight; };
  auto append_bf16 = [](std::vector<uint16_t>& dst, const std::vector<float>& v) {
    for (float f : v) dst.push_back(f32_to_bf16(f));
  };
  HostAttention a;
  a.input_norm = get(io::kInputNorm, {H});
  if (s.qk_norm == io::QkNorm::PerHead) {
    a.q_norm = get(names::kQNorm, {hd});
    a.k_norm = get(names::kKNorm, {hd});
  } else if (s.qk_norm == io::QkNorm::Whole) {
    a.q_norm = get(names::kQNorm, {nh * hd});
    a.k_norm = get(names::kKNorm, {nkv * hd});
  }
  if (s.qkv_bias) {
    for (const auto& [p, rows] : {std::pair{"self_attn.q_proj.bias", nh * hd}, {"self_attn.k_proj.bias", nkv * hd},
                                  {"self_attn.v_proj.bias", nkv * hd}}) {
      const std::vector<float> b = get(p, {rows});
      a.qkv_bias.insert(a.qkv_bias.end(), b.begin(), b.end());
    }
  }
  append_bf16(a.qkv, get(proj(names::kQProj), {nh * hd, H}));
  append_bf16(a.qkv, get(proj(names::kKProj), {nkv * hd, H}));
  append_bf16(a.qkv, get(proj(names::kVProj), {nkv * hd, H}));
  append_bf16(a.o, get(proj(names::kOProj), {H, nh * hd}));
  return a;
}

}  // namespace moesq::runtime

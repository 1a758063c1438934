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
  no(s.qk_norm != io::QkNorm::PerHead, "its q/k norm is not per head");
  no(s.attention_bias || s.qkv_bias, "its attention projections have biases");
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
  a.q_norm = get(names::kQNorm, {hd});
  a.k_norm = get(names::kKNorm, {hd});
  append_bf16(a.qkv, get(proj(names::kQProj), {nh * hd, H}));
  append_bf16(a.qkv, get(proj(names::kKProj), {nkv * hd, H}));
  append_bf16(a.qkv, get(proj(names::kVProj), {nkv * hd, H}));
  append_bf16(a.o, get(proj(names::kOProj), {H, nh * hd}));
  return a;
}

}  // namespace moesq::runtime

// config.json's sizes against the stored tensors (see the header). Products are formed in 128 bits, so
// a config's 2^40 × 2^40 is a mismatch, not an overflow.
#include "io/config_check.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "io/tensor_names.h"
#include "io/tensor_names_families.h"

namespace moesq::io {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

std::string dims_str(__int128 a, __int128 b) {
  auto s = [](__int128 v) {
    std::string r;
    const bool neg = v < 0;
    if (neg) v = -v;
    do r.insert(r.begin(), static_cast<char>('0' + static_cast<int>(v % 10))); while ((v /= 10) > 0);
    return neg ? "-" + r : r;
  };
  return "[" + s(a) + ", " + s(b) + "]";
}

// Error unless tensor `name` has shape [rows, cols] (rows / cols as config.json implies them).
void expect_2d(const Checkpoint& ck, const std::string& name, __int128 rows, __int128 cols, const char* fields) {
  const std::vector<int64_t>& sh = ck.get(name).shape;
  const bool ok = sh.size() == 2 && sh[0] == rows && sh[1] == cols;
  MOESQ_CHECK(ok, ck.dir(), ": tensor ", name, " has shape ", shape_str(sh), " but config.json (", fields, ") says ",
              dims_str(rows, cols), ": config.json does not describe these tensors");
}

}  // namespace

void check_config_against_tensors(const Checkpoint& ck) {
  const ModelSpec& s = ck.spec();
  const __int128 H = s.hidden_size;
  if (ck.has(kEmbedTokens)) expect_2d(ck, kEmbedTokens, s.vocab_size, H, "vocab_size x hidden_size");
  const std::string last = layer_tensor(s.num_layers - 1, "");  // "model.layers.{L-1}."
  bool has_last = false;
  for (const std::string& n : ck.names()) has_last = has_last || n.compare(0, last.size(), last) == 0;
  MOESQ_CHECK(has_last, ck.dir(), ": config.json says num_hidden_layers = ", s.num_layers, ", but no tensor is named ",
              last, "* (the checkpoint stores fewer layers)");
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (!s.is_moe_layer(l)) continue;
    const std::string router = router_tensor(s, l);
    if (ck.has(router)) expect_2d(ck, router, s.num_experts, H, "num_experts x hidden_size");
    // Expert 0's gate: dense [I, H], or packed with I rows (the packed readers check the rest).
    const std::string gate = expert_tensor_prefix(s, l, 0, ExpertProj::Gate);
    if (ck.has(gate + kWeight))
      expect_2d(ck, gate + kWeight, s.moe_intermediate_size, H, "moe_intermediate_size x hidden_size");
    for (const char* suffix : {kWeightPacked, kWeightSparsePacked})
      if (ck.has(gate + suffix)) {
        const std::vector<int64_t>& sh = ck.get(gate + suffix).shape;
        MOESQ_CHECK(!sh.empty() && sh[0] == s.moe_intermediate_size, ck.dir(), ": tensor ", gate, suffix, " has shape ",
                    shape_str(sh), " but config.json says moe_intermediate_size = ", s.moe_intermediate_size,
                    " rows: config.json does not describe these tensors");
      }
    // The shared expert's gate [shared width, H] (DeepSeek: moe_intermediate_size × n_shared_experts).
    const LayerTensorNames& names = layer_tensor_names(s.model_type);
    const std::string shared =
        names.shared_expert ? layer_tensor(l, std::string(names.shared_expert) + ".gate_proj.weight") : "";
    if (s.num_shared_experts > 0 && !shared.empty() && ck.has(shared))
      expect_2d(ck, shared, s.shared_expert_intermediate_size, H, "shared_expert_intermediate_size x hidden_size");
    break;
  }
  for (int64_t l = 0; l < s.num_layers; ++l) {  // a dense MLP layer: mlp.gate_proj [intermediate_size, H]
    const std::string dense = layer_tensor(l, "mlp.gate_proj.weight");
    if (s.is_moe_layer(l) || !ck.has(dense)) continue;
    expect_2d(ck, dense, s.intermediate_size, H, "intermediate_size x hidden_size");
    break;
  }
  namespace fn = family_names;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string k = layer_tensor(l, std::string(fn::kAttn) + fn::kKProj + kWeight);
    const std::string o = layer_tensor(l, std::string(fn::kAttn) + fn::kOProj + kWeight);
    if (!ck.has(k)) continue;  // linear-attention / MLA layer: no k_proj
    expect_2d(ck, k, static_cast<__int128>(s.num_kv_heads) * s.head_dim, H,
              "num_key_value_heads * head_dim x hidden_size");
    if (ck.has(o))
      expect_2d(ck, o, H, static_cast<__int128>(s.num_heads) * s.head_dim, "hidden_size x num_attention_heads * head_dim");
    break;
  }
}

}  // namespace moesq::io

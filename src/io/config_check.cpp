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
  const std::string last_norm = layer_tensor(s.num_layers - 1, kInputNorm);
  MOESQ_CHECK(ck.has(last_norm), ck.dir(), ": config.json says num_hidden_layers = ", s.num_layers, ", but there is no ",
              last_norm, " (the checkpoint stores fewer layers)");
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (!s.is_moe_layer(l)) continue;
    const std::string router = router_tensor(s, l);
    if (ck.has(router)) expect_2d(ck, router, s.num_experts, H, "num_experts x hidden_size");
    break;
  }
  namespace fn = family_names;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string k = layer_tensor(l, std::string(fn::kAttn) + fn::kKProj + kWeight);
    const std::string o = layer_tensor(l, std::string(fn::kAttn) + fn::kOProj + kWeight);
    if (!ck.has(k)) continue;  // linear-attention / MLA layer: no k_proj
    expect_2d(ck, k, static_cast<__int128>(s.num_kv_heads) * s.head_dim, H, "num_key_value_heads * head_dim x hidden_size");
    if (ck.has(o)) expect_2d(ck, o, H, static_cast<__int128>(s.num_heads) * s.head_dim, "hidden_size x num_attention_heads * head_dim");
    break;
  }
}

}  // namespace moesq::io

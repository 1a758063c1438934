// Test support: transformers' float32 outputs of a family fixture (../shared/models/tiny-ARCH-
// reference/reference.safetensors and summary.json, see ../shared/models/README.md), and the
// per-layer parity checks the family tests share.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace moesq::test {

// Where the family fixture `name` is: $MOESQ_SHARED_MODELS/name if set; else the copy in
// tests/fixtures/families (most families: CI has no ../shared); else ../shared/models/name.
inline std::string shared_models_dir(const std::string& name) {
  if (const char* env = std::getenv("MOESQ_SHARED_MODELS")) return env;
  const std::string copied = std::string(MOESQ_FIXTURES) + "/families";
  if (std::filesystem::is_directory(copied + "/" + name)) return copied;
  return std::string(MOESQ_FIXTURES) + "/../../../shared/models";
}

struct FamilyReference {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids;                // [B, T]
  std::vector<float> logits;               // [B, T, V]
  std::vector<std::vector<float>> hidden;  // [L+1][B, T, H]
  std::vector<std::vector<float>> router;  // [L][B·T, E] (empty where not reported)
  double ce = 0.0;                         // summary.json cross-entropy (nats/token)
  std::vector<int32_t> row(int64_t b) const { return {ids.begin() + b * T, ids.begin() + (b + 1) * T}; }
};

inline FamilyReference load_family_reference(const std::string& fixture, int64_t num_layers) {
  const std::string dir = shared_models_dir(fixture) + "/" + fixture + "-reference";
  io::SafetensorsFile f(dir + "/reference.safetensors");
  FamilyReference r;
  const io::TensorView& ids = f.get("input_ids");
  r.B = ids.shape.at(0);
  r.T = ids.shape.at(1);
  const std::vector<float> idf = io::to_f32(ids);
  r.ids.assign(idf.begin(), idf.end());
  r.logits = io::to_f32(f.get("logits"));
  for (int64_t l = 0; l <= num_layers; ++l) r.hidden.push_back(io::to_f32(f.get("hidden_states." + std::to_string(l))));
  for (int64_t l = 0; l < num_layers; ++l) {
    const std::string k = "router_logits." + std::to_string(l);
    r.router.push_back(f.has(k) ? io::to_f32(f.get(k)) : std::vector<float>{});
  }
  std::ifstream in(dir + "/summary.json");
  r.ce = nlohmann::json::parse(in).at("ce").get<double>();
  return r;
}

// max |a − b| over n values starting at a, b.
inline double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

inline double max_abs(const std::vector<float>& a) {
  double m = 0.0;
  for (float v : a) m = std::max(m, std::fabs(static_cast<double>(v)));
  return m;
}

// Top-k sets of `ids` [n, k] against the reference logits [n, E]: equal unless the reference's
// k-th and (k+1)-th scores are within `tie_gap` (then either choice is legitimate).
inline int64_t topk_mismatches(const std::vector<int32_t>& ids, int64_t k, const float* ref_logits, int64_t n,
                               int64_t E, double tie_gap, int64_t* ties) {
  int64_t bad = 0;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> order(E);
    for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
    const float* z = ref_logits + t * E;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    std::vector<int32_t> want(order.begin(), order.begin() + k), got(ids.begin() + t * k, ids.begin() + (t + 1) * k);
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    if (want == got) continue;
    if (k < E && z[order[k - 1]] - z[order[k]] <= tie_gap) {
      ++*ties;
      continue;
    }
    ++bad;
  }
  return bad;
}

}  // namespace moesq::test

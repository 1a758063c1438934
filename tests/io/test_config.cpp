// config.json → ModelSpec: both key spellings (hub fixture vs the embedded model written by newer
// transformers) must give the same spec; missing keys, wrong types, disagreeing spellings,
// unsupported RoPE variants and unknown architectures give errors naming the key and the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"

namespace fs = std::filesystem;
using moesq::Error;
using nlohmann::json;
using namespace moesq::io;

namespace {

const std::string kHub = std::string(MOESQ_FIXTURES) + "/hub-style-config.json";
const std::string kNew = std::string(MOESQ_DEFAULT_MODEL) + "/config.json";

json read(const std::string& path) { return json::parse(std::ifstream(path)); }

// The error message of parse_config(j), or "" when it succeeds.
std::string error_of(const json& j, const std::string& source = "cfg/config.json") {
  try {
    parse_config(j, source);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const json& j, const std::vector<std::string>& needles) {
  const std::string msg = error_of(j);
  ASSERT_FALSE(msg.empty()) << "accepted: " << j.dump();
  EXPECT_NE(msg.find("cfg/config.json"), std::string::npos) << msg;
  for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg << "\nmissing: " << n;
}

}  // namespace

TEST(Config, BothSpellingsGiveTheSameSpec) {
  const json hub = read(kHub), cur = read(kNew);
  ASSERT_TRUE(hub.contains("num_experts") && !hub.contains("num_local_experts"));
  ASSERT_TRUE(cur.contains("num_local_experts") && !cur.contains("num_experts"));
  const ModelSpec a = load_config(kHub), b = load_config(kNew);
  // Each field against the raw JSON of its own file, then the two specs against each other.
  EXPECT_EQ(a.num_experts, hub["num_experts"].get<int64_t>());
  EXPECT_EQ(b.num_experts, cur["num_local_experts"].get<int64_t>());
  EXPECT_EQ(a.rope_theta, hub["rope_theta"].get<double>());
  EXPECT_EQ(b.rope_theta, cur["rope_parameters"]["rope_theta"].get<double>());
  EXPECT_EQ(b.hidden_size, cur["hidden_size"].get<int64_t>());
  EXPECT_EQ(b.moe_intermediate_size, cur["moe_intermediate_size"].get<int64_t>());
  EXPECT_EQ(b.num_layers, cur["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(b.top_k, cur["num_experts_per_tok"].get<int64_t>());
  EXPECT_EQ(b.head_dim, cur["head_dim"].get<int64_t>());
  EXPECT_EQ(b.num_kv_heads, cur["num_key_value_heads"].get<int64_t>());
  EXPECT_EQ(b.norm_topk_prob, cur["norm_topk_prob"].get<bool>());
  EXPECT_EQ(b.rms_norm_eps, cur["rms_norm_eps"].get<double>());
  EXPECT_EQ(b.vocab_size, cur["vocab_size"].get<int64_t>());

  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  for (int64_t l = 0; l < a.num_layers; ++l) {
    EXPECT_TRUE(a.is_moe_layer(l));
    EXPECT_TRUE(b.is_moe_layer(l));
  }
}

TEST(Config, BothSpellingsPresentMustAgree) {
  json j = read(kNew);
  j["num_experts"] = j["num_local_experts"];
  j["rope_theta"] = j["rope_parameters"]["rope_theta"];
  EXPECT_EQ(error_of(j), "");
  j["num_experts"] = j["num_local_experts"].get<int64_t>() + 1;
  expect_error(j, {"num_experts", "num_local_experts", "disagree"});
  j = read(kHub);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  expect_error(j, {"rope_theta", "disagree"});
}

TEST(Config, MissingKeysAreNamed) {
  const json base = read(kHub);
  for (const char* key : {"model_type", "vocab_size", "hidden_size", "moe_intermediate_size",
                          "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                          "num_experts_per_tok", "intermediate_size"}) {
    json j = base;
    j.erase(key);
    expect_error(j, {std::string("\"") + key + "\""});
  }
  json j = base;
  j.erase("num_experts");
  expect_error(j, {"num_experts", "num_local_experts"});
  j = base;
  j.erase("rope_theta");
  expect_error(j, {"rope_theta"});
  // null counts as missing (hub configs write null for unused keys).
  j = base;
  j["hidden_size"] = nullptr;
  expect_error(j, {"\"hidden_size\""});
  // Loading from disk names the file path.
  try {
    load_config("/nonexistent/dir/config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/config.json"), std::string::npos);
  }
}

TEST(Config, OptionalKeysTakeTransformersDefaults) {
  json j = read(kHub);
  for (const char* key : {"norm_topk_prob", "rms_norm_eps", "tie_word_embeddings", "decoder_sparse_step",
                          "mlp_only_layers"}) {
    j.erase(key);
  }
  const ModelSpec s = parse_config(j, "cfg");
  EXPECT_FALSE(s.norm_topk_prob);  // Qwen3MoeConfig default
  EXPECT_EQ(s.rms_norm_eps, 1e-6);
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_EQ(s.decoder_sparse_step, 1);
  EXPECT_TRUE(s.mlp_only_layers.empty());
}

TEST(Config, UnknownArchitecture) {
  json j = read(kHub);
  j["model_type"] = "llama";
  expect_error(j, {"llama", "qwen3_moe"});
  j["model_type"] = "gemma3";  // unknown: the message lists what is supported
  expect_error(j, {"gemma3", "qwen2_moe", "mixtral", "olmoe"});
}

TEST(Config, BadValues) {
  const json base = read(kNew);
  json j = base;
  j["hidden_size"] = "256";
  expect_error(j, {"hidden_size", "integer"});
  j = base;
  j["num_experts_per_tok"] = 64;
  expect_error(j, {"num_experts_per_tok"});
  j = base;
  j["num_key_value_heads"] = 3;
  expect_error(j, {"num_key_value_heads"});
  j = base;
  j["rope_parameters"]["rope_type"] = "yarn";
  expect_error(j, {"yarn", "rope_parameters"});
  j = base;
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  expect_error(j, {"rope_scaling"});
  j = base;
  j["hidden_act"] = "gelu";
  expect_error(j, {"hidden_act"});
  j = base;
  j["mlp_only_layers"] = {0, 99};
  expect_error(j, {"mlp_only_layers", "99"});
  j = base;
  j["moe_intermediate_size"] = 0;
  expect_error(j, {"moe_intermediate_size", "positive"});
  EXPECT_FALSE(error_of(json::array()).empty());
}

TEST(Config, MoeLayerPattern) {
  json j = read(kHub);
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  const ModelSpec s = parse_config(j, "cfg");
  // transformers: sparse iff not in mlp_only_layers and (l + 1) % step == 0.
  const bool expect[] = {false, true, false, false, false, true};
  for (int l = 0; l < 6; ++l) EXPECT_EQ(s.is_moe_layer(l), expect[l]) << "layer " << l;
}

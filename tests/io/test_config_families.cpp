// Per-family config parsing (io/config_families.cpp) on the fixtures' own config.json files: the family
// facts land in ModelSpec as data, keys moesq does not implement are errors naming the key and the file,
// and the tensor-name tables build and recognise each family's routed-expert names.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"
#include "io/tensor_names.h"

namespace {

using moesq::Error;
using moesq::io::ModelSpec;
using nlohmann::json;

json fixture_config(const std::string& arch) {
  return json::parse(std::ifstream(std::string(MOESQ_FIXTURES) + "/families/tiny-" + arch + "/config.json"));
}

std::string error_of(const json& j) {
  try {
    moesq::io::parse_config(j, "cfg/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigFamilies, Qwen2MoeSharedExpertBiasesDenseLayer) {
  const ModelSpec s = moesq::io::parse_config(fixture_config("qwen2-moe"), "qwen2");
  EXPECT_EQ(s.head_dim, 32);  // hidden_size / num_attention_heads (no head_dim key)
  EXPECT_EQ(s.qk_norm, moesq::io::QkNorm::None);
  EXPECT_TRUE(s.qkv_bias);
  EXPECT_FALSE(s.attention_bias);
  EXPECT_FALSE(s.norm_topk_prob);
  EXPECT_EQ(s.num_shared_experts, 1);
  EXPECT_EQ(s.shared_expert_intermediate_size, 128);
  EXPECT_TRUE(s.shared_expert_gate);
  EXPECT_FALSE(s.is_moe_layer(1));
  EXPECT_TRUE(s.is_moe_layer(2));
  EXPECT_EQ(s.moe_intermediate_size, 64);
  EXPECT_EQ(s.intermediate_size, 256);
}

TEST(ConfigFamilies, MixtralExpertWidthAndRenormalisation) {
  const ModelSpec s = moesq::io::parse_config(fixture_config("mixtral"), "mixtral");
  EXPECT_EQ(s.moe_intermediate_size, 96);  // intermediate_size is the expert width
  EXPECT_EQ(s.num_experts, 8);
  EXPECT_EQ(s.top_k, 2);
  EXPECT_TRUE(s.norm_topk_prob);
  EXPECT_EQ(s.num_shared_experts, 0);
  EXPECT_EQ(moesq::io::expert_tensor_prefix(s, 1, 7, moesq::io::ExpertProj::Up),
            "model.layers.1.block_sparse_moe.experts.7.w3");
  EXPECT_EQ(moesq::io::router_tensor(s, 0), "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_TRUE(moesq::io::is_expert_tensor("model.layers.1.block_sparse_moe.experts.7.w2.weight_packed"));
  EXPECT_FALSE(moesq::io::is_expert_tensor("model.layers.1.block_sparse_moe.gate.weight"));
  EXPECT_EQ(moesq::io::tensor_role(s, "model.layers.1.block_sparse_moe.gate.weight"), moesq::io::TensorRole::Router);
  json j = fixture_config("mixtral");
  j["sliding_window"] = 4096;
  const std::string msg = error_of(j);
  EXPECT_NE(msg.find("sliding_window"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cfg/config.json"), std::string::npos) << msg;
}

TEST(ConfigFamilies, OlmoeWholeProjectionNormAndClipRefused) {
  const ModelSpec s = moesq::io::parse_config(fixture_config("olmoe"), "olmoe");
  EXPECT_EQ(s.qk_norm, moesq::io::QkNorm::Whole);
  EXPECT_FALSE(s.norm_topk_prob);
  EXPECT_EQ(s.moe_intermediate_size, 64);
  json j = fixture_config("olmoe");
  j["clip_qkv"] = 8.0;
  const std::string msg = error_of(j);
  EXPECT_NE(msg.find("clip_qkv"), std::string::npos) << msg;
}

TEST(ConfigFamilies, SharedExpertTensorsAreNotRoutedExperts) {
  const ModelSpec s = moesq::io::parse_config(fixture_config("qwen2-moe"), "qwen2");
  const std::string se = "model.layers.0.mlp.shared_expert.gate_proj.weight";
  EXPECT_FALSE(moesq::io::is_expert_tensor(se));
  EXPECT_FALSE(moesq::io::in_expert_container(se));
  EXPECT_EQ(moesq::io::tensor_role(s, se), moesq::io::TensorRole::SharedExpert);
  EXPECT_EQ(moesq::io::tensor_role(s, "model.layers.0.mlp.shared_expert_gate.weight"),
            moesq::io::TensorRole::SharedExpertGate);
  EXPECT_EQ(moesq::io::tensor_role(s, "model.layers.1.mlp.gate_proj.weight"), moesq::io::TensorRole::DenseMlp);
  EXPECT_EQ(moesq::io::tensor_role(s, "model.layers.0.mlp.experts.3.down_proj.weight"),
            moesq::io::TensorRole::RoutedExpert);
}

TEST(ConfigFamilies, MissingSharedExpertWidthIsAnError) {
  json j = fixture_config("qwen2-moe");
  j.erase("shared_expert_intermediate_size");
  const std::string msg = error_of(j);
  EXPECT_NE(msg.find("shared_expert_intermediate_size"), std::string::npos) << msg;
}

}  // namespace

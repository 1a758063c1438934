// io/tensor_names.h: the names the loader, the exporter and `inspect` share, built and parsed back.
#include <gtest/gtest.h>

#include "io/config.h"
#include "io/tensor_names.h"

namespace {

using namespace moesq::io;

ModelSpec family(const char* model_type) {
  ModelSpec s;
  s.model_type = model_type;
  return s;
}

TEST(TensorNames, BuildsHfNames) {
  const ModelSpec qwen = family("qwen3_moe"), mixtral = family("mixtral");
  EXPECT_EQ(layer_tensor(3, "self_attn.q_proj.weight"), "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(expert_tensor_prefix(qwen, 1, 17, ExpertProj::Down), "model.layers.1.mlp.experts.17.down_proj");
  EXPECT_EQ(expert_tensor_prefix(qwen, 1, 17, ExpertProj::Up), "model.layers.1.mlp.experts.17.up_proj");
  EXPECT_EQ(expert_tensor_prefix(qwen, 0, 0, ExpertProj::Gate) + kWeightGlobalScale,
            "model.layers.0.mlp.experts.0.gate_proj.weight_global_scale");
  // Every name goes through the family's table: Mixtral's block and w1 (gate) / w3 (up) / w2 (down).
  EXPECT_EQ(expert_tensor_prefix(mixtral, 1, 7, ExpertProj::Gate), "model.layers.1.block_sparse_moe.experts.7.w1");
  EXPECT_EQ(expert_tensor_prefix(mixtral, 1, 7, ExpertProj::Up), "model.layers.1.block_sparse_moe.experts.7.w3");
  EXPECT_EQ(expert_tensor_prefix(mixtral, 1, 7, ExpertProj::Down), "model.layers.1.block_sparse_moe.experts.7.w2");
}

TEST(TensorNames, ParsesWhatItBuilds) {
  for (const char* model_type : {"qwen3_moe", "mixtral", "qwen2_moe", "deepseek_v3", "gpt_oss"}) {
    const ModelSpec s = family(model_type);
    for (ExpertProj p : {ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down}) {
      const std::string name = expert_tensor_prefix(s, 12, 345, p) + kWeightPacked;
      const auto t = parse_expert_tensor(name);
      ASSERT_TRUE(t.has_value()) << name;
      EXPECT_EQ(t->layer, 12);
      EXPECT_EQ(t->expert, 345);
      EXPECT_EQ(t->proj, layer_tensor_names(model_type).expert_proj[static_cast<int>(p)]) << name;
      EXPECT_EQ(expert_proj_of(t->proj), p) << name;
      EXPECT_EQ(t->suffix, "weight_packed");
      EXPECT_TRUE(is_expert_tensor(name)) << name;
    }
  }
}

// The exporter's test (was a regex): the three projections with any suffix, and the two fused expert
// weights of a layer (gpt-oss; exact names, their biases excluded), nothing else.
TEST(TensorNames, ExpertTensorTest) {
  for (const char* ok : {"model.layers.0.mlp.experts.0.gate_proj.weight",
                         "model.layers.10.mlp.experts.127.down_proj.weight_scale",
                         "model.layers.2.mlp.experts.3.up_proj.weight.extra", "model.layers.0.mlp.experts.gate_up_proj",
                         "model.layers.23.mlp.experts.down_proj"})
    EXPECT_TRUE(is_expert_tensor(ok)) << ok;
  for (const char* no : {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.gate_proj.weight",
                         "model.layers.0.mlp.experts.0.w1.weight", "model.layers.x.mlp.experts.0.up_proj.weight",
                         "model.layers.0.mlp.experts..up_proj.weight", "model.layers.0.mlp.experts.0.up_proj",
                         "lm_head.weight", "model.layers.0.mlp.experts.gate_up_proj_bias",
                         "model.layers.0.mlp.experts.down_proj_bias", "model.layers.0.mlp.experts.gate_up_proj.weight",
                         "model.layers.x.mlp.experts.down_proj", "model.layers.0.mlp.experts.gate_up",
                         "model.layers.0.mlp.router.weight"})
    EXPECT_FALSE(is_expert_tensor(no)) << no;
  int64_t layer = -1;
  EXPECT_TRUE(is_fused_expert_weight("model.layers.17.mlp.experts.down_proj", &layer));
  EXPECT_EQ(layer, 17);
  // Mixtral's names live under block_sparse_moe only (and never the Qwen spellings there).
  EXPECT_TRUE(is_expert_tensor("model.layers.1.block_sparse_moe.experts.7.w1.weight"));
  EXPECT_TRUE(is_expert_tensor("model.layers.1.block_sparse_moe.experts.7.w2.weight_packed"));
  EXPECT_FALSE(is_expert_tensor("model.layers.1.block_sparse_moe.experts.7.gate_proj.weight"));
  EXPECT_FALSE(is_expert_tensor("model.layers.1.block_sparse_moe.gate.weight"));
  EXPECT_FALSE(is_expert_tensor("model.layers.0.mlp.shared_expert.gate_proj.weight"));
  EXPECT_TRUE(in_expert_container("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_FALSE(in_expert_container(kEmbedTokens));
  // A per-expert Linear bias (gpt-oss as the compressed-tensors export writes it) is not a compressed
  // projection: copied as stored, its role is ExpertBias like the fused bias tensors'.
  EXPECT_FALSE(is_expert_tensor("model.layers.1.mlp.experts.3.gate_proj.bias"));
  EXPECT_FALSE(is_expert_tensor("model.layers.1.mlp.experts.3.down_proj.bias"));
}

TEST(TensorNames, ExpertBiasRoleCoversFusedAndPerExpertBiases) {
  ModelSpec s;
  s.model_type = "gpt_oss";
  s.num_layers = 2;
  for (const char* b : {"model.layers.1.mlp.experts.gate_up_proj_bias", "model.layers.1.mlp.experts.down_proj_bias",
                        "model.layers.1.mlp.experts.0.gate_proj.bias", "model.layers.1.mlp.experts.7.up_proj.bias",
                        "model.layers.0.mlp.experts.2.down_proj.bias"})
    EXPECT_EQ(tensor_role(s, b), TensorRole::ExpertBias) << b;
  EXPECT_EQ(tensor_role(s, "model.layers.1.mlp.experts.0.gate_proj.weight"), TensorRole::RoutedExpert);
  EXPECT_NE(tensor_role(s, "model.layers.1.mlp.experts.0.other_proj.bias"), TensorRole::ExpertBias);
}

// A layer number from a file that does not fit int64 is no index (it overflowed, undefined
// behaviour, and wrapped negative: a "routed-expert tensor" of a layer below 0 that the compression
// skipped while copying nothing). Such a name is not an expert tensor; it is copied as stored.
TEST(TensorNames, HugeLayerNumbersAreNotIndices) {
  ModelSpec s = family("qwen3_moe");
  s.num_layers = 4;
  s.num_experts = 8;
  const std::string huge = "model.layers.99999999999999999999.mlp.experts.0.gate_proj.weight";
  EXPECT_FALSE(parse_expert_tensor(huge).has_value());
  EXPECT_FALSE(is_expert_tensor(huge));
  EXPECT_FALSE(is_compressed_expert_tensor(s, huge));
  EXPECT_EQ(tensor_role(s, huge), TensorRole::Other);
  const std::string max = "model.layers.9000000000000000000.mlp.experts.0.gate_proj.weight";  // fits int64
  ASSERT_TRUE(parse_expert_tensor(max).has_value());
  EXPECT_EQ(parse_expert_tensor(max)->layer, int64_t{9000000000000000000});
  EXPECT_FALSE(is_compressed_expert_tensor(s, max)) << "past num_hidden_layers: copied whole";
  EXPECT_TRUE(is_compressed_expert_tensor(s, "model.layers.3.mlp.experts.7.down_proj.weight"));
  EXPECT_FALSE(is_compressed_expert_tensor(s, "model.layers.3.mlp.experts.8.down_proj.weight")) << "past num_experts";
}

}  // namespace

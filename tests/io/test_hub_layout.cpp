// The hub layout of Qwen3.5-MoE (io/hub_layout.h) read through io::Checkpoint: a checkpoint built in
// the test from the per-expert fixture (tests/support/hub_checkpoint.h: wrapper config, the
// "model.language_model." prefix, fused experts, a vision and an MTP tensor) must present exactly the
// fixture's flat tensors — same names, dtypes, shapes and bytes — plus the two foreign tensors; the
// config seen is the text model's; writers get the stored names and config back. Bad input (a fused
// tensor of the wrong shape, a text_config missing a key, a duplicated expert) is an Error naming the
// tensor or key.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/hub_layout.h"
#include "io/tensor_names.h"
#include "support/hub_checkpoint.h"
#include "support/temp_dir.h"

namespace {

using moesq::io::Checkpoint;

std::string fixture() { return std::string(MOESQ_FIXTURES) + "/families/tiny-qwen3.5-moe"; }

std::string error_of(const std::string& dir) {
  try {
    Checkpoint c(dir);
  } catch (const moesq::Error& e) {
    return e.what();
  }
  return "";
}

TEST(HubLayout, FlatViewIsTheFixtureTensorForTensor) {
  const Checkpoint flat(fixture());
  moesq::test::TempDir tmp("moesq_hub");
  moesq::test::write_hub_checkpoint(flat, tmp.path.string());
  const Checkpoint hub(tmp.path.string());
  ASSERT_GT(hub.shard_files().size(), 1u) << "the test should exercise a sharded index";
  EXPECT_TRUE(hub.layout().nested());
  EXPECT_EQ(hub.config()["model_type"], "qwen3_5_moe_text");
  EXPECT_EQ(hub.spec().model_type, "qwen3_5_moe_text");
  EXPECT_EQ(hub.config()["architectures"][0], "Qwen3_5MoeForConditionalGeneration");  // lifted from the wrapper

  const std::vector<std::string> flat_names = flat.names();
  std::set<std::string> want(flat_names.begin(), flat_names.end());
  for (const std::string& n : moesq::test::hub_extra_tensors()) want.insert(n);
  const std::vector<std::string> got_v = hub.names();
  EXPECT_EQ(std::set<std::string>(got_v.begin(), got_v.end()), want);
  int64_t experts = 0;
  for (const std::string& n : flat.names()) {
    const moesq::io::TensorView &a = flat.get(n), &b = hub.get(n);
    ASSERT_TRUE(a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes) << n << " " << b.shape_str();
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0) << n << " differs from the per-expert fixture";
    experts += moesq::io::is_expert_tensor(n);
  }
  EXPECT_EQ(experts, 4 * 16 * 3);  // every layer MoE, 16 experts, 3 projections: all from fused tensors

  // Writers: stored names and the wrapper config come back.
  EXPECT_EQ(hub.stored_name("model.layers.2.self_attn.q_proj.weight"), "model.language_model.layers.2.self_attn.q_proj.weight");
  EXPECT_EQ(hub.stored_name("model.layers.1.mlp.experts.7.down_proj.weight_packed"),
            "model.language_model.layers.1.mlp.experts.7.down_proj.weight_packed");
  EXPECT_EQ(hub.stored_name("lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(hub.stored_name("model.visual.patch_embed.proj.weight"), "model.visual.patch_embed.proj.weight");
  nlohmann::json text = hub.config();
  text["quantization_config"] = {{"quant_method", "moesq"}};
  const nlohmann::json out = hub.stored_config(text);
  EXPECT_EQ(out["model_type"], "qwen3_5_moe");
  EXPECT_EQ(out["quantization_config"]["quant_method"], "moesq");
  EXPECT_FALSE(out["text_config"].contains("quantization_config"));
  EXPECT_FALSE(out["text_config"].contains("architectures"));  // lifted keys go back to the top
  EXPECT_EQ(out["text_config"]["hidden_size"], flat.config()["hidden_size"]);
  EXPECT_TRUE(out.contains("vision_config"));

  // A flat checkpoint is its own layout.
  EXPECT_FALSE(flat.layout().nested());
  EXPECT_EQ(flat.stored_name("model.layers.0.mlp.gate.weight"), "model.layers.0.mlp.gate.weight");
  EXPECT_EQ(flat.stored_config(flat.config()), flat.config());
}

// A wrapper config over tensors stored without the nesting prefix: read as they are, and new
// tensors are named the same way.
TEST(HubLayout, WrapperWithoutPrefixKeepsItsNames) {
  const Checkpoint flat(fixture());
  moesq::test::TempDir tmp("moesq_hub_noprefix");
  moesq::test::HubEdits ed;
  ed.no_prefix = true;
  moesq::test::write_hub_checkpoint(flat, tmp.path.string(), ed);
  const Checkpoint hub(tmp.path.string());
  EXPECT_TRUE(hub.layout().nested());
  EXPECT_EQ(hub.layout().text_prefix, "");
  for (const std::string& n : flat.names()) {
    ASSERT_TRUE(hub.has(n)) << n;
    EXPECT_EQ(std::memcmp(hub.get(n).data, flat.get(n).data, flat.get(n).nbytes), 0) << n;
  }
  EXPECT_EQ(hub.stored_name("model.layers.1.mlp.experts.7.down_proj.weight_packed"),
            "model.layers.1.mlp.experts.7.down_proj.weight_packed");
}

TEST(HubLayout, FusedTensorOfTheWrongShapeNamesIt) {
  const Checkpoint flat(fixture());
  moesq::test::TempDir tmp("moesq_hub_bad");
  moesq::test::HubEdits ed;
  ed.extra_gate_up_rows = 2;
  moesq::test::write_hub_checkpoint(flat, tmp.path.string(), ed);
  const std::string err = error_of(tmp.path.string());
  EXPECT_NE(err.find("model.language_model.layers.0.mlp.experts.gate_up_proj"), std::string::npos) << err;
  EXPECT_NE(err.find("[16, 130, 128]"), std::string::npos) << err;
  EXPECT_NE(err.find("expected [16, 128, 128]"), std::string::npos) << err;
}

TEST(HubLayout, DuplicatedExpertIsRefused) {
  const Checkpoint flat(fixture());
  moesq::test::TempDir tmp("moesq_hub_dup");
  moesq::test::HubEdits ed;
  ed.duplicate_expert = true;
  moesq::test::write_hub_checkpoint(flat, tmp.path.string(), ed);
  const std::string err = error_of(tmp.path.string());
  EXPECT_NE(err.find("model.layers.0.mlp.experts.0.gate_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("both stand for"), std::string::npos) << err;
}

TEST(HubLayout, TextConfigErrorsNameTheKey) {
  const Checkpoint flat(fixture());
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"missing hidden_size", [](nlohmann::json& c) { c["text_config"].erase("hidden_size"); },
       {"config.json text_config", "\"hidden_size\""}},
      {"missing linear_num_key_heads", [](nlohmann::json& c) { c["text_config"].erase("linear_num_key_heads"); },
       {"text_config", "\"linear_num_key_heads\""}},
      {"no text_config", [](nlohmann::json& c) { c.erase("text_config"); }, {"\"text_config\"", "qwen3_5_moe"}},
      {"text_config not an object", [](nlohmann::json& c) { c["text_config"] = 3; }, {"\"text_config\"", "object"}},
      {"wrong inner model_type", [](nlohmann::json& c) { c["text_config"]["model_type"] = "qwen3_moe"; },
       {"text_config.model_type", "qwen3_5_moe_text"}},
  };
  for (const Case& c : cases) {
    moesq::test::TempDir tmp("moesq_hub_cfg");
    moesq::test::HubEdits ed;
    ed.config = c.edit;
    moesq::test::write_hub_checkpoint(flat, tmp.path.string(), ed);
    const std::string err = error_of(tmp.path.string());
    ASSERT_FALSE(err.empty()) << c.what << ": accepted";
    for (const std::string& s : c.expect) EXPECT_NE(err.find(s), std::string::npos) << c.what << ": " << err;
  }
}

}  // namespace

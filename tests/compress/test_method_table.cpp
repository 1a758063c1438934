// The method table (compress/method.h): every row is complete and found by its name, and the
// resume manifest's method and options are byte-for-byte what the binary before the table wrote for
// the same options (a work dir committed by that binary must still be resumable), for the CLI's
// defaults and for non-default values of every method's options.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "compress/method.h"
#include "compress/pipeline.h"
#include "compress/work_dir.h"
#include "core/error.h"
#include "io/checkpoint.h"

namespace moesq::compress {
namespace {

// `moesq compress`'s options (variant 0: its defaults; 1: a non-default value of every option a
// method records).
CompressOptions cli_options(const std::string& method, int variant) {
  CompressOptions o;
  o.method = parse_method(method);
  o.refine.rule_batch = o.refine.rule_epochs = o.refine.rule_lr_A = o.refine.rule_lr_V = true;
  if (variant == 1) {
    o.sgptq.percdamp = 0.05;
    o.refine.epochs = 2;
    o.refine.batch = 16;
    o.refine.rule_batch = false;
    o.refine.restore_best = true;
    o.refine.p = 0;
    o.refine.lr_V = 1e-4;
    o.refine.seed = 3;
    o.jsq.rho = 1.0;
    o.obr.alpha = 0.3;
  }
  return o;
}

// {"method", "options"} of the manifest, as written by the binary before the method table (the same
// options through its run_manifest).
struct Golden {
  int variant;
  const char* method;
  const char* json;
};
const Golden kGolden[] = {
    {0, "rtn-nvfp4",
     R"({"method":"rtn-nvfp4","options":{"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.01}}})"},
    {0, "magnitude",
     R"({"method":"magnitude","options":{"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.01}}})"},
    {0, "sgptq",
     R"({"method":"sgptq","options":{"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.01}}})"},
    {0, "moesq",
     R"({"method":"moesq","options":{"refine":{"act_block":32,"batch":64,"beta1":0.9,"beta2":0.95,"epochs":10,"heldout_fraction":0.1,"kappa0":100.0,"kappa1":500.0,"keep_init_if_worse":false,"lr_A":0.00025,"lr_V":5e-05,"lr_final_frac":0.1,"micro_batch":64,"min_rows":0,"p":2,"restore_best":false,"rule_batch":true,"rule_epochs":true,"rule_lr_A":true,"rule_lr_V":true,"rule_per_expert":true,"s":4.0,"seed":0,"sigma":0.01,"tau0":2.0,"tau1":0.05,"update_A":true,"weight_decay":1.0},"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.01}}})"},
    {0, "jsq",
     R"({"method":"jsq","options":{"jsq":{"clip_high":0.01,"rho":2.1,"rows_per_mean":128},"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.01}}})"},
    {0, "obr",
     R"({"method":"obr","options":{"obr":{"alpha":0.5,"rtn":false},"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.01}}})"},
    {1, "rtn-nvfp4",
     R"({"method":"rtn-nvfp4","options":{"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.05}}})"},
    {1, "magnitude",
     R"({"method":"magnitude","options":{"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.05}}})"},
    {1, "sgptq",
     R"({"method":"sgptq","options":{"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.05}}})"},
    {1, "moesq",
     R"({"method":"moesq","options":{"refine":{"act_block":32,"batch":16,"beta1":0.9,"beta2":0.95,"epochs":2,"heldout_fraction":0.1,"kappa0":100.0,"kappa1":500.0,"keep_init_if_worse":false,"lr_A":0.00025,"lr_V":0.0001,"lr_final_frac":0.1,"micro_batch":64,"min_rows":0,"p":0,"restore_best":true,"rule_batch":false,"rule_epochs":true,"rule_lr_A":true,"rule_lr_V":true,"rule_per_expert":true,"s":4.0,"seed":3,"sigma":0.01,"tau0":2.0,"tau1":0.05,"update_A":true,"weight_decay":1.0},"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.05}}})"},
    {1, "jsq",
     R"({"method":"jsq","options":{"jsq":{"clip_high":0.01,"rho":1.0,"rows_per_mean":128},"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.05}}})"},
    {1, "obr",
     R"({"method":"obr","options":{"obr":{"alpha":0.3,"rtn":false},"sgptq":{"block_size":128,"min_tokens":0,"pattern_at_group":true,"percdamp":0.05}}})"},
};

TEST(MethodTable, ManifestOptionsAreTheBytesTheEarlierBinaryWrote) {
  const io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  CalibSet calib;
  calib.sequences = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  for (const Golden& g : kGolden) {
    const nlohmann::json m = run_manifest(ckpt, calib, cli_options(g.method, g.variant));
    const nlohmann::json j = {{"method", m["method"]}, {"options", m["options"]}};
    EXPECT_EQ(j.dump(), g.json) << g.method << " variant " << g.variant;
  }
  EXPECT_EQ(std::size(kGolden), 2 * all_methods().size()) << "a golden per method and variant";
}

TEST(MethodTable, EveryRowIsCompleteAndFoundByName) {
  std::set<std::string> names;
  for (const Method* m : all_methods()) {
    ASSERT_NE(m, nullptr);
    EXPECT_TRUE(names.insert(m->name).second) << "duplicate name " << m->name;
    EXPECT_EQ(parse_method(m->name), m);
    EXPECT_NE(m->help, nullptr) << m->name;
    EXPECT_NE(m->compress, nullptr) << m->name;
    // Options JSON goes to both files: both keys are needed, and nothing to record needs none.
    EXPECT_EQ(m->options_json != nullptr, m->manifest_key != nullptr) << m->name;
    EXPECT_EQ(m->options_json != nullptr, m->report_key != nullptr) << m->name;
    if (m->omitted) EXPECT_NE(m->options_json, nullptr) << m->name;
  }
  EXPECT_FALSE(methods::kRtnNvfp4.sparse);
  EXPECT_TRUE(methods::kMoesq.refines);
  EXPECT_EQ(CompressOptions{}.method, &methods::kSgptq);
}

TEST(MethodTable, OnlyTheChosenMethodsOptionsAreValidated) {
  CompressOptions o = cli_options("jsq", 0);
  o.jsq.clip_high = 1.0;
  try {
    validate(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("clip_high"), std::string::npos) << e.what();
  }
  o.method = &methods::kSgptq;  // jsq's options are not sgptq's concern
  EXPECT_NO_THROW(validate(o));
  o = cli_options("obr", 0);
  o.obr.alpha = 1.5;
  EXPECT_THROW(validate(o), Error);
  o = cli_options("moesq", 0);
  o.refine.tau0 = -1;
  EXPECT_THROW(validate(o), Error);
}

}  // namespace
}  // namespace moesq::compress

// End-to-end `moesq generate` (CPU device) on the embedded model: greedy output equals a greedy loop
// over the library's KV-cached decoder, sampling is reproducible from --seed, bad flags are errors.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "model/kv_decoder.h"
#include "model/decoder.h"
#include "support/cli_run.h"

namespace fs = std::filesystem;

namespace {

using moesq::test::CliRun;
using moesq::test::slurp;

CliRun run(const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("moesq_test_cli_generate_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  CliRun r = moesq::test::run_moesq(args, dir.string());
  fs::remove_all(dir);
  return r;
}

const std::string kModel = std::string("'") + MOESQ_DEFAULT_MODEL + "'";

}  // namespace

TEST(CliGenerate, GreedyMatchesDecoderLoop) {
  const CliRun r = run("generate " + kModel + " --prompt 'the expert ' --max-new-tokens 12 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const std::vector<int32_t> ids = j.at("generated_ids").get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 12u);
  const moesq::io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  const moesq::model::DecoderModel m(ckpt);
  moesq::model::KvDecoder dec(m, 64, m.default_forward_options());
  std::vector<float> z;
  for (unsigned char c : std::string("the expert ")) z = dec.step(c);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t want = static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
    ASSERT_EQ(ids[i], want) << "token " << i;
    z = dec.step(want);
  }
  EXPECT_EQ(j.at("text").get<std::string>().size(), 12u);
}

TEST(CliGenerate, SamplingReproducibleFromSeed) {
  const std::string base = "generate " + kModel + " --prompt 'a ' --max-new-tokens 10 --temperature 0.8 --top-p 0.9 --json";
  const CliRun a = run(base + " --seed 5"), b = run(base + " --seed 5");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(nlohmann::json::parse(a.out).at("generated_ids"), nlohmann::json::parse(b.out).at("generated_ids"));
}

TEST(CliGenerate, BadFlagsAreNamedErrors) {
  CliRun r = run("generate " + kModel + " --max-new-tokens 4");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--prompt"), std::string::npos) << r.err;
  r = run("generate " + kModel + " --prompt x --max-new-tokens 4 --temperature -1");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--temperature"), std::string::npos) << r.err;
  r = run("generate " + kModel + " --prompt x --max-new-tokens 4 --experts bf16");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--experts"), std::string::npos) << r.err;
  r = run("generate " + kModel + " --prompt x --max-new-tokens 4 --deterministic off");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--deterministic off applies to --device cuda"), std::string::npos) << r.err;
}

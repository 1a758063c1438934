// End-to-end `moesq tokenize`: runs the built binary on the tokenizer fixtures and the embedded
// byte-level model; checks the ids against the tokenizers library's reference encodings, the JSON
// contract, decode round trips, and that bad input names the flag or file and exits 1.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace {

const std::string kMistral = std::string(MOESQ_FIXTURES) + "/tokenizers/bpe-bytefallback-mistral-style";
const std::string kQwen = std::string(MOESQ_FIXTURES) + "/tokenizers/bpe-bytelevel-qwen-style";

using moesq::test::CliRun;
using moesq::test::slurp;

class CliTokenize : public ::testing::Test {
 protected:
  moesq::test::TempDir dir_{"moesq_test_cli_tokenize"};

  CliRun run(const std::string& args) { return moesq::test::run_moesq("tokenize " + args, dir_.path.string()); }
};

std::string join(const std::vector<int32_t>& ids, const char* sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

TEST_F(CliTokenize, EncodeMatchesReferenceAndRoundTrips) {
  const nlohmann::json ref = nlohmann::json::parse(slurp(kMistral + "/reference_encodings.json"));
  const nlohmann::json& c = ref[0];  // "Hello, world!"
  const std::vector<int32_t> ids = c["ids"];
  const std::string text_file = dir_.write("text.txt", c["text"].get<std::string>());

  CliRun r = run("'" + kMistral + "' --text-file '" + text_file + "' --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(j["tokens"][0], "<s>");

  r = run("'" + kMistral + "/tokenizer.json' --text-file '" + text_file + "'");  // the file itself, plain output
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, join(ids, " ") + "\n");

  r = run("'" + kMistral + "' --text-file '" + text_file + "' --no-special");
  EXPECT_EQ(r.out, join(std::vector<int32_t>(ids.begin() + 1, ids.end()), " ") + "\n");

  r = run("'" + kMistral + "' --decode-ids '" + join(ids, ",") + "' --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["text"], c["decoded"]);

  r = run("'" + kMistral + "' --text ''");  // empty text is text: BOS only
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "1\n");

  // --decode-ids-file takes what --json printed.
  const std::string ids_file = dir_.write("ids.json", j.dump());
  r = run("'" + kMistral + "' --decode-ids-file '" + ids_file + "' --no-special");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, c["text"].get<std::string>() + "\n");
}

TEST_F(CliTokenize, ByteLevelCheckpointWithoutTokenizerIsIdentity) {
  CliRun r = run(std::string("'") + MOESQ_DEFAULT_MODEL + "' --text 'Hi!' --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"], nlohmann::json::parse("[72, 105, 33]"));
  r = run(std::string("'") + MOESQ_DEFAULT_MODEL + "' --decode-ids 72,105,33");
  EXPECT_EQ(r.out, "Hi!\n");
}

TEST_F(CliTokenize, BadInputNamesTheFlagOrFile) {
  CliRun r = run("'" + kQwen + "' --decode-ids '1,x'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--decode-ids: \"x\""), std::string::npos) << r.err;

  r = run("'" + kQwen + "' --decode-ids 99999");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("id 99999 at position 0"), std::string::npos) << r.err;

  r = run("'" + kQwen + "' --text-file '" + dir_.file("missing.txt") + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--text-file: " + dir_.file("missing.txt")), std::string::npos) << r.err;

  r = run("'" + kQwen + "' --text a --decode-ids 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("exactly one of --text"), std::string::npos) << r.err;

  // A non-byte-level checkpoint without tokenizer.json.
  dir_.write("config.json", R"({"vocab_size": 151936})");
  r = run("'" + dir_.path.string() + "' --text a");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("no tokenizer.json, and config.json vocab_size is 151936"), std::string::npos) << r.err;

  // An unsupported component.
  nlohmann::json t = nlohmann::json::parse(slurp(kQwen + "/tokenizer.json"));
  t["normalizer"] = {{"type", "NFKC"}};
  const std::string bad = dir_.write("tokenizer.json", t.dump());
  r = run("'" + bad + "' --text a");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find(bad + ": normalizer.type \"NFKC\" is not supported"), std::string::npos) << r.err;
}

}  // namespace

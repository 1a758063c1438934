// Text inputs go through the checkpoint's tokenizer.json: `eval --data` text equals
// eval of the same ids as .npy, `compress --calib` text equals `--calib` of the ids, `generate --prompt`
// equals `--prompt-ids` of the encoded prompt (BOS included) and prints the tokenizer's decode of the
// generated ids. The checkpoint is the tiny model grown to the fixture tokenizers' 3000-id vocabulary
// (tests/support/tokenizer_checkpoint.h). Without tokenizer.json a non-byte checkpoint refuses text,
// naming the directory, and still reads .npy ids.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/tokenizer.h"
#include "support/cli_run.h"
#include "support/temp_dir.h"
#include "support/tokenizer_checkpoint.h"

namespace fs = std::filesystem;

namespace {

const std::string kQwen = std::string(MOESQ_FIXTURES) + "/tokenizers/bpe-bytelevel-qwen-style/tokenizer.json";
const std::string kMistral = std::string(MOESQ_FIXTURES) + "/tokenizers/bpe-bytefallback-mistral-style/tokenizer.json";
constexpr int64_t kVocab = 3000;  // both fixture tokenizers

using moesq::test::CliRun;
using moesq::test::slurp;

// int32 .npy, 1-D (numpy's v1 header, padded to 64 bytes).
void write_npy(const std::string& path, const std::vector<int32_t>& ids) {
  std::string h = "{'descr': '<i4', 'fortran_order': False, 'shape': (" + std::to_string(ids.size()) + ",), }";
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const char len[2] = {static_cast<char>(h.size() & 0xff), static_cast<char>(h.size() >> 8)};
  f.write(len, 2);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
}

// English-like text with punctuation, digits and a non-ASCII word; deterministic.
std::string sample_text(int sentences) {
  const char* words[] = {"the", "expert", "routes", "tokens", "to", "a", "sparse", "kernel", "über",
                         "quantized", "weights", "of", "layer", "4:8", "and", "Hello,", "world!"};
  std::string s;
  uint32_t x = 12345;
  for (int i = 0; i < sentences; ++i) {
    for (int w = 0; w < 9; ++w) {
      x = x * 1664525u + 1013904223u;
      s += (w ? " " : "") + std::string(words[(x >> 16) % 17]);
    }
    s += i % 5 == 4 ? ".\n" : ". ";
  }
  return s;
}

class TextInputs : public ::testing::Test {
 protected:
  moesq::test::TempDir tmp_{"moesq_test_cli_text_inputs"};
  std::string qwen_dir_ = tmp_.file("qwen"), mistral_dir_ = tmp_.file("mistral"), bare_dir_ = tmp_.file("bare");

  void SetUp() override {
    const moesq::io::Checkpoint src(MOESQ_DEFAULT_MODEL);
    moesq::test::write_tokenizer_checkpoint(src, qwen_dir_, kVocab, kQwen);
    moesq::test::write_tokenizer_checkpoint(src, mistral_dir_, kVocab, kMistral);
    moesq::test::write_tokenizer_checkpoint(src, bare_dir_, kVocab, "");
  }

  CliRun run(const std::string& args) {
    return moesq::test::run_moesq(args, tmp_.path.string());
  }
};

TEST_F(TextInputs, EvalTextEqualsEvalOfTokenizerIds) {
  const std::string text = sample_text(60);
  const std::string txt = tmp_.write("data.txt", text);
  const std::vector<int32_t> ids = moesq::io::Tokenizer::from_file(kQwen).encode(text, {.add_special_tokens = false});
  ASSERT_LT(ids.size(), text.size() / 2) << "the BPE must merge bytes, or this test cannot tell ids from bytes";
  write_npy(tmp_.file("data.npy"), ids);

  const CliRun a = run("eval '" + qwen_dir_ + "' --data '" + txt + "' --seq-len 64 --json");
  ASSERT_EQ(a.rc, 0) << a.err;
  const CliRun b = run("eval '" + qwen_dir_ + "' --data '" + tmp_.file("data.npy") + "' --seq-len 64 --json");
  ASSERT_EQ(b.rc, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["predicted_tokens"], jb["predicted_tokens"]);
  EXPECT_GT(ja["predicted_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(ja["files"][0]["tokens"].get<size_t>(), ids.size());
  EXPECT_EQ(ja["nats_per_token"].get<double>(), jb["nats_per_token"].get<double>());  // same ids, same windows
  EXPECT_GT(ja["nats_per_token"].get<double>(), 0.0);
}

TEST_F(TextInputs, NoTokenizerRefusesTextNamingTheDirectoryAndReadsNpy) {
  const std::string txt = tmp_.write("data.txt", sample_text(20));
  const CliRun a = run("eval '" + bare_dir_ + "' --data '" + txt + "' --seq-len 32");
  EXPECT_EQ(a.rc, 1);
  EXPECT_NE(a.err.find(bare_dir_), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("tokenizer.json"), std::string::npos) << a.err;
  EXPECT_EQ(a.out, "");
  std::vector<int32_t> ids;
  for (int i = 0; i < 200; ++i) ids.push_back((i * 37) % kVocab);
  write_npy(tmp_.file("ids.npy"), ids);
  const CliRun b = run("eval '" + bare_dir_ + "' --data '" + tmp_.file("ids.npy") + "' --seq-len 32 --json");
  EXPECT_EQ(b.rc, 0) << b.err;
  const CliRun g = run("generate '" + bare_dir_ + "' --prompt 'Hello' --max-new-tokens 2");
  EXPECT_EQ(g.rc, 1);
  EXPECT_NE(g.err.find(bare_dir_), std::string::npos) << g.err;
}

TEST_F(TextInputs, GeneratePromptUsesTokenizerAndPrintsDecodedText) {
  const moesq::io::Tokenizer tok = moesq::io::Tokenizer::from_file(kMistral);
  const std::string prompt = "Hello, world! The expert";
  const std::vector<int32_t> pids = tok.encode(prompt);  // with the post-processor's BOS <s>
  ASSERT_EQ(pids.front(), tok.token_to_id("<s>").value());
  std::string ids_text;
  for (int32_t t : pids) ids_text += std::to_string(t) + " ";
  const std::string ids_file = tmp_.write("prompt_ids.txt", ids_text);

  const CliRun a = run("generate '" + mistral_dir_ + "' --prompt '" + prompt + "' --max-new-tokens 8 --json");
  ASSERT_EQ(a.rc, 0) << a.err;
  const CliRun b = run("generate '" + mistral_dir_ + "' --prompt-ids '" + ids_file + "' --max-new-tokens 8 --json");
  ASSERT_EQ(b.rc, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["prompt_tokens"].get<size_t>(), pids.size());
  const std::vector<int32_t> out = ja["generated_ids"];
  EXPECT_EQ(out, jb["generated_ids"].get<std::vector<int32_t>>());
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(ja["text"].get<std::string>(), tok.decode(out));
  EXPECT_EQ(jb["text"].get<std::string>(), tok.decode(out));  // --prompt-ids output is decoded too
  // Plain output: the decoded text and a newline.
  const CliRun c = run("generate '" + mistral_dir_ + "' --prompt '" + prompt + "' --max-new-tokens 8");
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(c.out, tok.decode(out) + "\n");
}

TEST_F(TextInputs, CompressCalibTextEqualsCalibOfTokenizerIds) {
  const std::string text = sample_text(80);
  const std::string txt = tmp_.write("calib.txt", text);
  write_npy(tmp_.file("calib.npy"), moesq::io::Tokenizer::from_file(kQwen).encode(text, {.add_special_tokens = false}));
  auto compress = [&](const std::string& calib, const std::string& out) {
    const CliRun r = run("compress '" + qwen_dir_ + "' --method sgptq --out '" + out + "' --calib '" + calib +
                         "' --calib-samples 4 --seq-len 48 --threads 2 --json");
    EXPECT_EQ(r.rc, 0) << r.err;
  };
  compress(txt, tmp_.file("out_txt"));
  compress(tmp_.file("calib.npy"), tmp_.file("out_npy"));
  const moesq::io::Checkpoint a(tmp_.file("out_txt")), b(tmp_.file("out_npy"));
  ASSERT_EQ(a.names(), b.names());
  size_t compared = 0;
  for (const std::string& n : a.names()) {
    const auto& ta = a.get(n);
    const auto& tb = b.get(n);
    ASSERT_EQ(ta.nbytes, tb.nbytes) << n;
    EXPECT_EQ(0, std::memcmp(ta.data, tb.data, ta.nbytes)) << n << " differs: the text was not tokenized as the ids";
    ++compared;
  }
  EXPECT_GT(compared, 0u);
  EXPECT_TRUE(fs::exists(fs::path(tmp_.file("out_txt")) / "tokenizer.json"));  // travels with the checkpoint
}

}  // namespace

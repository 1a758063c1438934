// runtime::Generator over the CPU decode backend (model::KvDecoder per slot) on the default model:
// the tokens `moesq generate --device cpu` printed before the Generator existed (ids recorded from
// that binary) and a plain KvDecoder + Sampler loop, greedy and sampled; sequences sharing the steps
// (and a reused slot) give each one's tokens alone; stop ids; errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "model/decoder.h"
#include "model/kv_decoder.h"
#include "runtime/decode_backend.h"
#include "runtime/generator.h"
#include "runtime/sampler.h"

namespace {

using namespace moesq;

std::vector<int32_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }  // the byte-level vocabulary

runtime::SamplerOptions sampling(float temperature, float top_p, uint64_t seed) {
  runtime::SamplerOptions o;
  o.temperature = temperature, o.top_p = top_p, o.seed = seed;
  return o;
}
runtime::StopOptions max_new(int64_t n) {
  runtime::StopOptions s;
  s.max_new_tokens = n;
  return s;
}

// The loop `moesq generate --device cpu` ran before: prefill by steps, then sample / decode.
std::vector<int32_t> plain_loop(const model::DecoderModel& m, const std::vector<int32_t>& prompt,
                                const runtime::SamplerOptions& so, int64_t n) {
  model::KvDecoder dec(m, static_cast<int64_t>(prompt.size()) + n, m.default_forward_options());
  runtime::Sampler sampler(so);
  std::vector<float> z;
  for (int32_t t : prompt) z = dec.step(t);
  std::vector<int32_t> out;
  while (true) {
    out.push_back(sampler.next(z.data(), m.spec().vocab_size));
    if (static_cast<int64_t>(out.size()) == n) break;
    z = dec.step(out.back());
  }
  return out;
}

class GeneratorCpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ckpt_ = new io::Checkpoint(MOESQ_DEFAULT_MODEL);
    m_ = new model::DecoderModel(*ckpt_);
  }
  static void TearDownTestSuite() {
    delete m_;
    delete ckpt_;
  }
  static io::Checkpoint* ckpt_;
  static model::DecoderModel* m_;
};
io::Checkpoint* GeneratorCpu::ckpt_ = nullptr;
model::DecoderModel* GeneratorCpu::m_ = nullptr;

// `moesq generate models/tiny-qwen3-moe --prompt P --max-new-tokens 16 [flags] --json` of the tree
// before the Generator (generated_ids).
TEST_F(GeneratorCpu, TokensOfThePreviousGenerateCommand) {
  struct Case {
    std::string prompt;
    runtime::SamplerOptions so;
    std::vector<int32_t> want;
  };
  const std::vector<Case> cases = {
      {"the expert ", sampling(0.0f, 1.0f, 0), {116, 111, 32, 116, 104, 101, 32, 115, 116, 97, 116, 101, 32, 111, 102, 32}},
      {"the expert ", sampling(0.8f, 0.9f, 7), {111, 102, 32, 108, 105, 110, 107, 46, 10, 10, 76, 85, 67, 73, 79, 58}},
      {"a ", sampling(1.3f, 0.5f, 123), {108, 105, 115, 116, 32, 111, 102, 32, 111, 112, 116, 105, 111, 110, 115, 32}},
  };
  for (const Case& c : cases) {
    const std::vector<int32_t> prompt = bytes_of(c.prompt);
    runtime::CpuDecodeBackend dec(*m_, static_cast<int64_t>(prompt.size()) + 16, 1, m_->default_forward_options());
    runtime::Generator gen(dec);
    EXPECT_EQ(gen.generate(prompt, c.so, max_new(16)), c.want) << "prompt '" << c.prompt << "' T=" << c.so.temperature;
    EXPECT_EQ(plain_loop(*m_, prompt, c.so, 16), c.want) << "prompt '" << c.prompt << "'";
  }
}

// Three sequences of other prompts, samplers and lengths share the decode steps of a 2-slot
// backend (the third waits for a free slot): each gets the tokens it gets alone.
TEST_F(GeneratorCpu, SharedStepsAndReusedSlotsGiveEachSequenceItsTokens) {
  const std::vector<int32_t> pa = bytes_of("the expert "), pb = bytes_of("a "), pc = bytes_of("moe ");
  const auto sa = sampling(0.0f, 1.0f, 0), sb = sampling(0.8f, 0.9f, 7), sc = sampling(1.1f, 0.95f, 9);
  runtime::CpuDecodeBackend dec(*m_, 40, 2, m_->default_forward_options());
  runtime::Generator gen(dec);
  const int a = gen.add(pa, sa, max_new(12)), b = gen.add(pb, sb, max_new(5));
  EXPECT_THROW(gen.add(pc, sc, max_new(3)), Error) << "both slots are running";
  while (!gen.finished(b)) gen.step();
  EXPECT_FALSE(gen.finished(a));
  const int c = gen.add(pc, sc, max_new(9));  // into b's slot, while a runs on
  while (gen.running() > 0) gen.step();
  EXPECT_EQ(gen.output(a), plain_loop(*m_, pa, sa, 12));
  EXPECT_EQ(gen.output(b), plain_loop(*m_, pb, sb, 5));
  EXPECT_EQ(gen.output(c), plain_loop(*m_, pc, sc, 9));
  EXPECT_EQ(gen.output(c).size(), 9u);
}

TEST_F(GeneratorCpu, StopIdEndsTheSequenceAndIsKept) {
  const std::vector<int32_t> prompt = bytes_of("the expert ");
  const std::vector<int32_t> greedy = plain_loop(*m_, prompt, sampling(0.0f, 1.0f, 0), 8);
  ASSERT_EQ(greedy[2], 32);  // "to " then the first space
  runtime::CpuDecodeBackend dec(*m_, 40, 1, m_->default_forward_options());
  runtime::Generator gen(dec);
  runtime::StopOptions stop = max_new(8);
  stop.stop_ids = {32};
  const std::vector<int32_t> got = gen.generate(prompt, sampling(0.0f, 1.0f, 0), stop);
  EXPECT_EQ(got, std::vector<int32_t>(greedy.begin(), greedy.begin() + 3));
}

TEST_F(GeneratorCpu, BadRequestsAreErrors) {
  runtime::CpuDecodeBackend dec(*m_, 8, 1, m_->default_forward_options());
  runtime::Generator gen(dec);
  EXPECT_THROW(gen.add({}, sampling(0.0f, 1.0f, 0), max_new(2)), Error);
  EXPECT_THROW(gen.add({1}, sampling(0.0f, 1.0f, 0), max_new(0)), Error);
  EXPECT_THROW(gen.add({1}, sampling(-1.0f, 1.0f, 0), max_new(2)), Error);
  EXPECT_THROW(gen.output(0), Error);
  EXPECT_THROW(dec.decode({0, 0}, {1, 2}), Error) << "a slot twice in one step";
  EXPECT_THROW(dec.decode({1}, {1}), Error) << "slot out of range";
  EXPECT_THROW(runtime::CpuDecodeBackend(*m_, 8, 0, m_->default_forward_options()), Error);
}

}  // namespace

// Expert parallelism in the engine (docs/PARALLEL.md "The expert-parallel engine"), its protocol with
// G = 2 and 3 ranks on ONE GPU: each rank an Engine holding its contiguous shard of the routed experts
// (dist::engine_expert_range), their exchange an all-reduce of uint32 words between threads of this
// process through host memory (runtime::host_staged_exchange, as `mpirun` ranks do over MPI). Every
// rank's logits, batched prefill and decode steps, are BITWISE those of the whole model on one GPU, for
// the fixtures' families (softmax and sigmoid routers, shared experts, a dense layer, MLA, Gated
// DeltaNet) and a compressed checkpoint; a synthetic engine's shard draws that slice of the whole
// model's experts; a shard without an exchange, or outside the experts, is refused by name.
#include <gtest/gtest.h>

#include <barrier>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/partition.h"
#include "io/checkpoint.h"
#include "runtime/engine.h"
#include "support/gpu_test_main.h"
#include "support/text_tokens.h"

using namespace moesq;

namespace {

using moesq::test::text_tokens;

// The ranks' all-reduce SUM of uint32 words, on threads of one process: each rank puts its words in,
// all wait, each sums every rank's words in rank order (integer adds: exact, as ncclUint32's), all wait.
class ThreadAllReduce {
 public:
  explicit ThreadAllReduce(int ranks) : parts_(ranks), sync_(ranks) {}
  void sum(int rank, uint32_t* words, int64_t count) {
    parts_[rank].assign(words, words + count);
    sync_.arrive_and_wait();
    for (int64_t i = 0; i < count; ++i) {
      uint32_t s = 0;
      for (const auto& p : parts_) s += p[i];
      words[i] = s;
    }
    sync_.arrive_and_wait();  // nobody refills parts_ before every rank has read it
  }

 private:
  std::vector<std::vector<uint32_t>> parts_;
  std::barrier<> sync_;
};

// What every rank (and the one-GPU engine) runs: two sequences prefilled together (all logits), then
// four decode steps over both slots. Returns every logit in order.
std::vector<float> workload(runtime::Engine& eng) {
  std::vector<float> out = eng.forward({{0, text_tokens(37, 11)}, {1, text_tokens(23, 12)}}, true);
  const int64_t V = eng.spec().vocab_size;
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> z = eng.decode({0, 1}, {static_cast<int32_t>((7 * step + 3) % V),
                                                     static_cast<int32_t>((11 * step + 5) % V)});
    out.insert(out.end(), z.begin(), z.end());
  }
  return out;
}

// The G ranks' engines (made by `make` with each rank's options) running `workload` on G threads.
std::vector<std::vector<float>> run_ranks(int G, int64_t E, const runtime::EngineOptions& base,
                                          const std::function<std::unique_ptr<runtime::Engine>(
                                              const runtime::EngineOptions&)>& make,
                                          std::vector<size_t>* weight_bytes = nullptr) {
  ThreadAllReduce ar(G);
  std::vector<std::unique_ptr<runtime::Engine>> engines;
  for (int r = 0; r < G; ++r) {
    runtime::EngineOptions o = base;
    const dist::ExpertRange mine = dist::engine_expert_range(E, r, G);
    o.expert_begin = mine.begin, o.expert_end = mine.end;
    o.exchange = runtime::host_staged_exchange([&ar, r](uint32_t* w, int64_t n) { ar.sum(r, w, n); });
    engines.push_back(make(o));
    if (weight_bytes) weight_bytes->push_back(engines.back()->weight_bytes());
  }
  std::vector<std::vector<float>> out(G);
  std::vector<std::string> errors(G);
  std::vector<std::thread> threads;
  for (int r = 0; r < G; ++r)
    threads.emplace_back([&, r] {
      try {
        out[r] = workload(*engines[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();  // (a rank that throws leaves its peers at the barrier: the test then hangs
      }                        //  and ctest's timeout names it; no rank is expected to throw)
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < G; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(bits(got[i]), bits(want[i])) << what << " logit " << i;
}

std::string family_dir(const char* name) { return std::string(MOESQ_FIXTURES) + "/families/" + name; }

}  // namespace

TEST(EngineExpertParallel, RanksGiveTheOneGpuBitsOnEveryFamily) {
  std::vector<std::string> dirs = {MOESQ_DEFAULT_MODEL, family_dir("tiny-deepseek-v3"), family_dir("tiny-qwen2-moe"),
                                   family_dir("tiny-qwen3-next"), family_dir("tiny-gpt-oss")};
  if (const char* c = std::getenv("MOESQ_TINY_COMPRESSED")) dirs.push_back(c);  // sparse W4A4 experts
  for (const std::string& dir : dirs) {
    const io::Checkpoint ckpt(dir);
    runtime::EngineOptions opt;
    opt.max_seqs = 2, opt.max_len = 64;  // experts: kAuto (bf16 for the fixtures, sparse W4A4 compressed)
    runtime::Engine whole(ckpt, opt);
    const std::vector<float> want = workload(whole);
    for (int G : {2, 3}) {
      std::vector<size_t> bytes;
      const auto got = run_ranks(
          G, ckpt.spec().num_experts, opt,
          [&](const runtime::EngineOptions& o) { return std::make_unique<runtime::Engine>(ckpt, o); }, &bytes);
      for (int r = 0; r < G; ++r) {
        expect_same_bits(got[r], want, dir + " G=" + std::to_string(G) + " rank " + std::to_string(r));
        EXPECT_LT(bytes[r], whole.weight_bytes()) << dir << " rank " << r << " holds only its experts";
      }
    }
    std::printf("[ep] %s: 2 and 3 ranks = one GPU bitwise (%zu logits)\n", dir.c_str(), want.size());
  }
}

// A synthetic engine's shard draws its experts' slice of each tensor: 2 ranks of the synthetic model
// give the whole synthetic model's bits (Qwen3-30B-A3B's shapes, 2 layers, paired 4:8 W4A4 experts).
TEST(EngineExpertParallel, SyntheticShardsAreTheWholeModelsExperts) {
  const io::ModelSpec spec = runtime::synthetic_spec("qwen3-30b-a3b", 2);
  runtime::EngineOptions opt;
  opt.max_seqs = 2, opt.max_len = 64;
  const auto backend = runtime::ExpertBackend::kSparseW4A4;
  runtime::Engine whole(spec, backend, 1234, opt);
  const std::vector<float> want = workload(whole);
  const auto got = run_ranks(2, spec.num_experts, opt, [&](const runtime::EngineOptions& o) {
    return std::make_unique<runtime::Engine>(spec, backend, 1234, o);
  });
  for (int r = 0; r < 2; ++r) expect_same_bits(got[r], want, "synthetic rank " + std::to_string(r));
}

TEST(EngineExpertParallel, AShardWithoutAnExchangeOrOutsideTheExpertsIsRefused) {
  const io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  const int64_t E = ckpt.spec().num_experts;
  runtime::EngineOptions opt;
  opt.max_seqs = 1, opt.max_len = 32, opt.expert_begin = 0, opt.expert_end = E / 2;
  try {
    runtime::Engine eng(ckpt, opt);
    FAIL() << "a shard without an exchange was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sharded without an exchange"), std::string::npos) << e.what();
  }
  opt.expert_end = E + 1;
  opt.exchange = runtime::host_staged_exchange([](uint32_t*, int64_t) {});
  try {
    runtime::Engine eng(ckpt, opt);
    FAIL() << "a shard past the experts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the"), std::string::npos) << e.what();  // the loader's words
  }
  opt.expert_begin = 0, opt.expert_end = E;  // the whole layer: no exchange needed, none called
  runtime::Engine eng(ckpt, opt);
  EXPECT_FALSE(eng.forward({{0, text_tokens(9, 1)}}, false).empty());
}

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }

// The scheduler against runtime::Generator on the tiny model (CPU backend): 64 requests submitted
// from 8 threads at once, with different prompt lengths, max_tokens, seeds and temperatures, each
// equal to Generator::generate of that request alone; stop ids, cancel, queue full, drain.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "io/checkpoint.h"
#include "model/decoder.h"
#include "runtime/decode_backend.h"
#include "runtime/generator.h"
#include "serve/scheduler.h"

using namespace moesq;

namespace {

constexpr int64_t kMaxLen = 64;

struct Tiny {
  io::Checkpoint ckpt{MOESQ_DEFAULT_MODEL};
  model::DecoderModel m{ckpt};
};
Tiny& tiny() {
  static Tiny t;
  return t;
}

serve::GenRequest request(int i) {
  serve::GenRequest r;
  for (int k = 0; k < 1 + i % 7; ++k) r.prompt.push_back(static_cast<int32_t>((37 * i + 11 * k) % 256));
  r.sampling.temperature = i % 3 == 0 ? 0.0f : 0.7f + 0.1f * static_cast<float>(i % 4);
  r.sampling.top_p = i % 2 ? 0.9f : 1.0f;
  r.sampling.seed = static_cast<uint64_t>(1000 + i);
  r.stop.max_new_tokens = 1 + i % 9;
  return r;
}

// Reads a stream to its end (bounded: 30 s).
serve::Stream::Chunk drain(serve::Stream& s) {
  serve::Stream::Chunk all;
  const auto t0 = std::chrono::steady_clock::now();
  while (!all.done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    serve::Stream::Chunk c = s.next(std::chrono::milliseconds(100));
    all.tokens.insert(all.tokens.end(), c.tokens.begin(), c.tokens.end());
    all.done = c.done, all.finish_reason = c.finish_reason, all.error = c.error;
  }
  return all;
}

}  // namespace

TEST(Scheduler, SixtyFourConcurrentRequestsEqualGeneratorAlone) {
  const int kN = 64;
  std::vector<std::vector<int32_t>> expected(kN);
  {
    runtime::CpuDecodeBackend one(tiny().m, kMaxLen, 1, tiny().m.default_forward_options());
    runtime::Generator gen(one);
    for (int i = 0; i < kN; ++i) {
      const serve::GenRequest r = request(i);
      expected[i] = gen.generate(r.prompt, r.sampling, r.stop);
    }
  }
  runtime::CpuDecodeBackend backend(tiny().m, kMaxLen, 6, tiny().m.default_forward_options());
  serve::Metrics metrics;
  serve::Scheduler sched(backend, serve::SchedulerOptions{kN}, metrics);
  std::vector<serve::Stream::Chunk> got(kN);
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t)
    clients.emplace_back([&, t] {
      for (int i = t; i < kN; i += 8) got[i] = drain(*sched.submit(request(i)));
    });
  for (auto& c : clients) c.join();
  int64_t total = 0;
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(got[i].done) << "request " << i;
    EXPECT_EQ(got[i].finish_reason, "length") << "request " << i;
    EXPECT_EQ(got[i].tokens, expected[i]) << "request " << i;
    total += static_cast<int64_t>(expected[i].size());
  }
  EXPECT_GT(total, kN);
  const std::string text = metrics.prometheus_text();
  EXPECT_NE(text.find("moesq:generation_tokens_total " + std::to_string(total) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("moesq:time_to_first_token_seconds_count 64\n"), std::string::npos) << text;
}

TEST(Scheduler, StopIdEndsWithStopAndKeepsTheId) {
  runtime::CpuDecodeBackend backend(tiny().m, kMaxLen, 2, tiny().m.default_forward_options());
  runtime::Generator gen(backend);
  serve::GenRequest r = request(3);
  r.stop.max_new_tokens = 8;
  const std::vector<int32_t> free_run = gen.generate(r.prompt, r.sampling, r.stop);
  ASSERT_GE(free_run.size(), 3u);
  serve::Metrics metrics;
  serve::Scheduler sched(backend, {}, metrics);
  r.stop.stop_ids = {free_run[2]};
  const auto c = drain(*sched.submit(r));
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[2]);
  EXPECT_EQ(c.finish_reason, "stop");
  EXPECT_EQ(c.tokens, std::vector<int32_t>(free_run.begin(), first + 1));
}

TEST(Scheduler, CancelFreesTheSlotAndQueueFullIsRefused) {
  runtime::CpuDecodeBackend backend(tiny().m, kMaxLen, 1, tiny().m.default_forward_options());
  serve::Metrics metrics;
  serve::Scheduler sched(backend, serve::SchedulerOptions{1}, metrics);
  serve::GenRequest longr = request(0);
  longr.stop.max_new_tokens = kMaxLen - 8;
  auto a = sched.submit(longr);  // takes the slot
  auto b = sched.submit(longr);  // waits
  EXPECT_THROW(sched.submit(longr), serve::SchedulerBusy);
  a->cancel();
  b->cancel();
  EXPECT_EQ(drain(*a).finish_reason, "cancelled");
  EXPECT_EQ(drain(*b).finish_reason, "cancelled");
  const auto c = drain(*sched.submit(request(5)));  // the slot is free again
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_EQ(c.tokens.size(), static_cast<size_t>(request(5).stop.max_new_tokens));
}

TEST(Scheduler, BadRequestsAreRefusedAtSubmit) {
  runtime::CpuDecodeBackend backend(tiny().m, kMaxLen, 1, tiny().m.default_forward_options());
  serve::Metrics metrics;
  serve::Scheduler sched(backend, {}, metrics);
  serve::GenRequest r = request(1);
  r.stop.max_new_tokens = 0;
  EXPECT_THROW(sched.submit(r), Error);
  r = request(1);
  r.prompt.clear();
  EXPECT_THROW(sched.submit(r), Error);
  r = request(1);
  r.sampling.top_p = 0.0f;
  EXPECT_THROW(sched.submit(r), Error);
}

TEST(Scheduler, ShutdownDrainFinishesInFlightThenRefuses) {
  runtime::CpuDecodeBackend backend(tiny().m, kMaxLen, 2, tiny().m.default_forward_options());
  serve::Metrics metrics;
  serve::Scheduler sched(backend, {}, metrics);
  std::vector<std::shared_ptr<serve::Stream>> s;
  for (int i = 0; i < 5; ++i) s.push_back(sched.submit(request(i)));
  sched.shutdown(true);
  for (int i = 0; i < 5; ++i) {
    const auto c = drain(*s[i]);
    EXPECT_EQ(c.finish_reason, "length") << i;
    EXPECT_EQ(c.tokens.size(), static_cast<size_t>(request(i).stop.max_new_tokens)) << i;
  }
  EXPECT_THROW(sched.submit(request(0)), serve::SchedulerBusy);
}

namespace {

// The CPU backend behind a counter of the seam's calls. Its first prefill_chunks waits for release(), so
// that a test can queue requests while the engine thread is busy (the next admission takes them all);
// a prompt equal to `poison` fails its prefill (alone or in a batch).
class CountingBackend final : public runtime::DecodeBackend {
 public:
  explicit CountingBackend(runtime::DecodeBackend& inner) : in_(inner) {}
  int64_t vocab_size() const override { return in_.vocab_size(); }
  int num_slots() const override { return in_.num_slots(); }
  std::vector<float> prefill(int slot, const std::vector<int32_t>& prompt) override {
    ++prefills;
    if (prompt == poison) throw Error("poisoned prompt");
    return in_.prefill(slot, prompt);
  }
  // The scheduler's prefill path: the first call waits for release(); each call is logged ('P', its
  // tokens in largest_tokens), a chunk equal to `poison` throws.
  std::vector<float> prefill_chunks(const std::vector<runtime::PrefillChunk>& chunks) override {
    if (batches++ == 0) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return released_; });
    }
    largest_batch = std::max(largest_batch.load(), static_cast<int>(chunks.size()));
    int tokens = 0;
    for (const auto& c : chunks) {
      if (c.tokens == poison) throw Error("poisoned prompt");
      tokens += static_cast<int>(c.tokens.size());
      continuations += !c.start;
    }
    largest_tokens = std::max(largest_tokens.load(), tokens);
    note('P');
    return in_.prefill_chunks(chunks);
  }
  std::vector<float> decode(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens) override {
    ++decodes;
    note('D');
    return in_.decode(slots, tokens);
  }
  std::vector<int32_t> decode_greedy(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens) override {
    ++greedy_decodes;
    note('D');
    return in_.decode_greedy(slots, tokens);
  }
  // Paged KV passes through (the scheduler sees the inner backend's pool).
  int64_t kv_block_tokens() const override { return in_.kv_block_tokens(); }
  int64_t kv_blocks() const override { return in_.kv_blocks(); }
  int64_t kv_free_blocks() const override { return in_.kv_free_blocks(); }
  void release(int slot) override {
    ++releases;
    in_.release(slot);
  }
  std::string calls() {
    std::lock_guard<std::mutex> lk(mu_);
    return log_;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }
  std::vector<int32_t> poison;
  std::atomic<int> prefills{0}, batches{0}, largest_batch{0}, largest_tokens{0}, continuations{0}, decodes{0},
      greedy_decodes{0}, releases{0};

 private:
  void note(char c) {
    std::lock_guard<std::mutex> lk(mu_);
    log_ += c;
  }
  std::string log_;  // one letter per call, in order: P prefill_chunks, D decode / decode_greedy
  runtime::DecodeBackend& in_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

serve::GenRequest greedy_request(int i) {
  serve::GenRequest r = request(i);
  r.sampling.temperature = 0.0f;
  r.stop.max_new_tokens = 3 + i % 5;
  return r;
}

std::vector<int32_t> generate_alone(const serve::GenRequest& r) {
  runtime::CpuDecodeBackend one(tiny().m, kMaxLen, 1, tiny().m.default_forward_options());
  return runtime::Generator(one).generate(r.prompt, r.sampling, r.stop);
}

// Request 0 is submitted alone (its prefill_chunks waits); then `rest` are queued and the gate opens.
std::vector<serve::Stream::Chunk> run_gated(CountingBackend& b, const std::vector<serve::GenRequest>& reqs,
                                            int64_t max_batched_tokens = 0) {
  serve::Metrics metrics;
  serve::Scheduler sched(b, serve::SchedulerOptions{16, max_batched_tokens}, metrics);
  std::vector<std::shared_ptr<serve::Stream>> streams{sched.submit(reqs[0])};
  while (b.batches.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (size_t i = 1; i < reqs.size(); ++i) streams.push_back(sched.submit(reqs[i]));
  b.release();
  std::vector<serve::Stream::Chunk> got;
  for (auto& s : streams) got.push_back(drain(*s));
  return got;
}

}  // namespace

TEST(Scheduler, AdmittedRequestsArePrefilledTogetherAndGreedyStepsDecodeIdsOnly) {
  std::vector<serve::GenRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(greedy_request(i));
  runtime::CpuDecodeBackend cpu(tiny().m, kMaxLen, 6, tiny().m.default_forward_options());
  CountingBackend b(cpu);
  const auto got = run_gated(b, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].finish_reason, "length") << "request " << i;
    EXPECT_EQ(got[i].tokens, generate_alone(reqs[i])) << "request " << i;
  }
  EXPECT_EQ(b.batches.load(), 2);        // request 0, then the four queued behind it in ONE batch
  EXPECT_EQ(b.largest_batch.load(), 4);
  EXPECT_EQ(b.decodes.load(), 0);        // every sequence greedy: no [B, V] logits
  EXPECT_GT(b.greedy_decodes.load(), 0);
}

TEST(Scheduler, ASampledSequenceInTheBatchTakesLogitsForEveryRow) {
  std::vector<serve::GenRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(greedy_request(i));
  reqs[2].sampling.temperature = 0.8f;
  reqs[2].stop.max_new_tokens = 7;  // the longest: every decode step has it
  runtime::CpuDecodeBackend cpu(tiny().m, kMaxLen, 4, tiny().m.default_forward_options());
  CountingBackend b(cpu);
  const auto got = run_gated(b, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, generate_alone(reqs[i])) << "request " << i;
  EXPECT_GT(b.decodes.load(), 0);
}

TEST(Scheduler, AFailedBatchPrefillEndsOnlyTheRequestAtFault) {
  std::vector<serve::GenRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(greedy_request(i));
  reqs[2].prompt = {7, 7, 7};
  runtime::CpuDecodeBackend cpu(tiny().m, kMaxLen, 4, tiny().m.default_forward_options());
  CountingBackend b(cpu);
  b.poison = reqs[2].prompt;
  const auto got = run_gated(b, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i == 2) {
      EXPECT_EQ(got[i].finish_reason, "error");
      EXPECT_NE(got[i].error.find("poisoned prompt"), std::string::npos) << got[i].error;
      EXPECT_TRUE(got[i].tokens.empty());
    } else {
      EXPECT_EQ(got[i].finish_reason, "length") << "request " << i;
      EXPECT_EQ(got[i].tokens, generate_alone(reqs[i])) << "request " << i;
    }
  }
  // Request 0; the batch of the three queued behind it, which fails; each of those three again alone.
  EXPECT_EQ(b.batches.load(), 5);
}

// Chunked prefill (max_batched_tokens 5): long prompts go in pieces of at most 5 tokens per step while
// the sequence already running keeps decoding between them, and every request's tokens are still those
// of Generator::generate alone (a prompt prefilled in pieces gives the bits of the whole prompt).
TEST(Scheduler, ChunkedPrefillInterleavesWithDecodeAndEqualsGeneratorAlone) {
  std::vector<serve::GenRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(greedy_request(i));
  reqs[0].stop.max_new_tokens = 24;  // decoding all along
  for (int i = 1; i < 4; ++i) {
    reqs[i].prompt.clear();
    for (int k = 0; k < 9 + 7 * i; ++k) reqs[i].prompt.push_back(static_cast<int32_t>((53 * i + 17 * k) % 256));
  }
  reqs[2].sampling.temperature = 0.9f;  // one sampled sequence: logits for the decode rows too
  runtime::CpuDecodeBackend cpu(tiny().m, kMaxLen, 4, tiny().m.default_forward_options());
  CountingBackend b(cpu);
  const auto got = run_gated(b, reqs, 5);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].finish_reason, "length") << "request " << i;
    EXPECT_EQ(got[i].tokens, generate_alone(reqs[i])) << "request " << i;
  }
  EXPECT_LE(b.largest_tokens.load(), 5);
  EXPECT_GT(b.continuations.load(), 0);
  const std::string calls = b.calls();
  // 16 + 23 + 30 prompt tokens behind request 0 need ≥ 14 chunk calls, each followed by a decode of
  // request 0 (and of whatever else is decoding): P and D alternate for a long stretch.
  EXPECT_NE(calls.find("PDPDPDPDPDPD"), std::string::npos) << calls;
}

// A prompt that fits the step's budget is never cut: with a budget of 10, prompts of 7 tokens go in
// whole, one per step (the second waits for the next step's budget instead of taking the 3 left).
TEST(Scheduler, APromptThatFitsTheBudgetIsNotCut) {
  std::vector<serve::GenRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(greedy_request(i));
    reqs.back().prompt.assign(7, static_cast<int32_t>(20 + i));
  }
  runtime::CpuDecodeBackend cpu(tiny().m, kMaxLen, 4, tiny().m.default_forward_options());
  CountingBackend b(cpu);
  const auto got = run_gated(b, reqs, 10);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, generate_alone(reqs[i])) << "request " << i;
  EXPECT_EQ(b.continuations.load(), 0);
  EXPECT_EQ(b.largest_tokens.load(), 7);
  EXPECT_EQ(b.batches.load(), 4);
}

// Paged KV (CPU backend with a pool of 5 blocks of 64 tokens for 4 slots): six requests whose prompts
// (50–60 tokens) take one block each and whose generations (30 tokens) cross into a second, so the
// pool runs out while they decode. The scheduler preempts the newest, prefills it again later from
// its prompt and generated tokens, and every request's tokens (greedy and sampled: the sampler state
// is kept across the preemption) are still Generator::generate's of that request alone.
TEST(Scheduler, PagedKvPreemptsTheNewestAndEveryRequestStillEqualsGeneratorAlone) {
  constexpr int64_t kLen = 256;
  std::vector<serve::GenRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    serve::GenRequest r = request(i);
    r.prompt.clear();
    for (int k = 0; k < 50 + 2 * i; ++k) r.prompt.push_back(static_cast<int32_t>((29 * i + 13 * k) % 256));
    r.stop.max_new_tokens = 30;
    reqs.push_back(r);
  }
  runtime::CpuDecodeBackend cpu(tiny().m, kLen, 4, tiny().m.default_forward_options(), 5 * runtime::kKvBlockTokens);
  ASSERT_EQ(cpu.kv_blocks(), 5);
  CountingBackend b(cpu);
  serve::Metrics metrics;
  std::vector<serve::Stream::Chunk> got;
  {
    serve::Scheduler sched(b, serve::SchedulerOptions{16, 0}, metrics);
    std::vector<std::shared_ptr<serve::Stream>> streams{sched.submit(reqs[0])};
    while (b.batches.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (size_t i = 1; i < reqs.size(); ++i) streams.push_back(sched.submit(reqs[i]));
    b.release();
    for (auto& st : streams) got.push_back(drain(*st));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    runtime::CpuDecodeBackend one(tiny().m, kLen, 1, tiny().m.default_forward_options());
    const std::vector<int32_t> want = runtime::Generator(one).generate(reqs[i].prompt, reqs[i].sampling, reqs[i].stop);
    EXPECT_EQ(got[i].finish_reason, "length") << "request " << i << ": " << got[i].error;
    EXPECT_EQ(got[i].tokens, want) << "request " << i;
  }
  const std::string text = metrics.prometheus_text();
  const std::string key = "\nmoesq:num_preemptions_total ";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GT(std::stoi(text.substr(at + key.size())), 0) << text;
  EXPECT_NE(text.find("moesq:kv_cache_usage_perc 0\n"), std::string::npos) << text;  // every block back
  EXPECT_EQ(cpu.kv_free_blocks(), 5);
  // Prompt tokens are counted once, however often a request was prefilled again.
  int64_t prompt_tokens = 0;
  for (const auto& r : reqs) prompt_tokens += static_cast<int64_t>(r.prompt.size());
  EXPECT_NE(text.find("moesq:prompt_tokens_total " + std::to_string(prompt_tokens) + "\n"), std::string::npos) << text;
}

// The paged CPU backend's refusals: a decode step the free blocks do not cover throws KvCacheFull and
// changes no slot; release returns the blocks; a prompt over the pool is refused before anything moves.
TEST(Scheduler, PagedCpuBackendRefusesAStepTheBlocksDoNotCover) {
  runtime::CpuDecodeBackend cpu(tiny().m, 128, 3, tiny().m.default_forward_options(), 3 * runtime::kKvBlockTokens);
  std::vector<int32_t> p64(64, 7), p65(65, 9);
  cpu.prefill(0, p64);
  cpu.prefill(1, p65);  // 2 blocks
  EXPECT_EQ(cpu.kv_free_blocks(), 0);
  EXPECT_THROW(cpu.decode({0}, {1}), runtime::KvCacheFull);  // slot 0 needs a second block
  EXPECT_EQ(cpu.kv_free_blocks(), 0);
  const std::vector<float> z = cpu.decode({1}, {3});  // slot 1 has room in its second block
  EXPECT_EQ(static_cast<int64_t>(z.size()), cpu.vocab_size());
  EXPECT_THROW(cpu.prefill(2, p64), runtime::KvCacheFull);
  cpu.release(1);
  EXPECT_EQ(cpu.kv_free_blocks(), 2);
  cpu.decode({0}, {1});
  EXPECT_EQ(cpu.kv_free_blocks(), 1);
  EXPECT_THROW(runtime::CpuDecodeBackend(tiny().m, 128, 2, tiny().m.default_forward_options(), 64), Error);
}

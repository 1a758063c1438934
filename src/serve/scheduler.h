// Continuous batching for `moesq serve`: requests from any thread, ONE engine thread that owns the
// runtime::DecodeBackend. Every step it admits waiting requests into free KV slots, prefills the next
// pieces of the admitted prompts — chunked prefill: at most SchedulerOptions::max_batched_tokens prompt
// tokens per step, first admitted first, in one DecodeBackend::prefill_chunks (the GPU engine packs
// them into forwards); a prompt that fits that budget goes in whole, a longer one in pieces — then, for every sequence whose prompt is in, samples the next token from that
// sequence's own runtime::Sampler, applies the stop conditions and sends the rest through one batched
// decode — DecodeBackend::decode_greedy when every sequence going on is greedy (the argmax on the GPU,
// no [B, V] logits to the host), else decode() and the samplers on the host. So a long prompt never
// stalls the running sequences for longer than one chunk, and a prompt longer than a forward is taken
// in pieces.
// The non-obvious decision: the per-sequence order is exactly runtime::Generator's (prefill; then
// sample, stop?, decode), so a request's tokens equal Generator::generate of that request alone on
// the CPU backend (and on the GPU engine in its deterministic mode), whatever else runs: a prefill
// row is bitwise the prompt's prefill alone there however the prompt was cut into chunks and batched,
// and a greedy sampler's token is the argmax.
// Paged KV (DecodeBackend::kv_block_tokens() > 0; the GPU engine always, the CPU backend with
// --kv-cache-tokens): a request is admitted when a slot is free AND the free KV blocks, less what the
// prompts being prefilled will still take and a 1 % watermark (vLLM's), hold its prompt; a step's
// prompt chunks are cut to the free blocks; and when the decoding sequences need more new blocks than
// are free, the sequence admitted LAST is preempted (vLLM's recompute policy): its slot and blocks are
// released and it waits, ahead of every new request, to be prefilled again from its prompt and the
// tokens it generated. Its sampler state is kept, and in the engine's deterministic mode the
// re-prefill gives the bits its decode steps gave, so preemption never changes a request's tokens.
// The last sequence running is never preempted (one sequence of max_len always fits the pool).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/decode_backend.h"
#include "runtime/generator.h"
#include "runtime/kv_blocks.h"
#include "runtime/sampler.h"
#include "serve/metrics.h"

namespace moesq::serve {

// One request: prompt ids in [0, V), sampling, and the token stop conditions (max_new_tokens >= 1).
struct GenRequest {
  std::vector<int32_t> prompt;
  runtime::SamplerOptions sampling;
  runtime::StopOptions stop;
};

// The tokens of one request as the engine produces them. Engine side: push / finish; client side:
// next / cancel. Thread-safe.
class Stream {
 public:
  struct Chunk {
    std::vector<int32_t> tokens;  // generated since the previous next()
    bool done = false;
    std::string finish_reason;    // when done: "stop", "length", "cancelled" or "error"
    std::string error;            // when finish_reason is "error": what failed
  };
  // Waits up to `timeout` for new tokens or the end; returns what came (possibly nothing).
  Chunk next(std::chrono::milliseconds timeout);
  // Ends the request at the next step (its slot is freed); finish_reason "cancelled" unless it had
  // finished already.
  void cancel();
  bool cancelled() const;

  void push(int32_t token);
  void finish(const std::string& reason, const std::string& error = "");

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> pending_;
  bool done_ = false, cancel_ = false;
  std::string reason_, error_;
};

// Refused submit(): the waiting queue is full or the scheduler is shutting down (HTTP 503).
class SchedulerBusy : public Error {
 public:
  using Error::Error;
};

struct SchedulerOptions {
  int64_t max_queue = 256;  // waiting requests beyond the running ones; more are refused
  // Prompt tokens prefilled per step (chunked prefill, beside the decode of the running sequences);
  // 0: the backend's max_prefill_tokens(), and where that is 0 too, whole prompts.
  int64_t max_batched_tokens = 0;
};

class Scheduler {
 public:
  // Starts the engine thread. `backend` and `metrics` must outlive the scheduler.
  Scheduler(runtime::DecodeBackend& backend, const SchedulerOptions& opt, Metrics& metrics);
  ~Scheduler();  // shutdown(false)
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request (thread-safe). Errors: moesq::Error for an empty prompt or max_new_tokens < 1
  // or bad sampler options (checked here, not on the engine thread); SchedulerBusy when full.
  std::shared_ptr<Stream> submit(GenRequest req);
  // Refuses new requests; drain = finish the waiting and running ones first, else cancel them.
  // Joins the engine thread. Idempotent.
  void shutdown(bool drain);
  int num_slots() const { return num_slots_; }

 private:
  struct Waiting {
    GenRequest req;
    std::shared_ptr<Stream> stream;
    std::chrono::steady_clock::time_point arrival;
  };
  struct Running {
    explicit Running(const runtime::SamplerOptions& o) : sampler(o) {}
    int slot = -1;
    std::vector<int32_t> prompt;  // while prefilling: the whole prompt (cleared once it is in)
    int64_t prefilled = 0;        // prompt tokens in the slot
    std::vector<int32_t> history; // the sequence so far: the request's prompt, then each generated token
    bool ended = false;           // end() ran: dropped at the end of the step
    bool preempted = false;       // preempt() ran this step: moved to preempted_ at the end of the step
    bool recompute = false;       // prompt = history after a preemption (its tokens are not counted again)
    runtime::Sampler sampler;
    runtime::StopOptions stop;
    std::shared_ptr<Stream> stream;
    std::vector<float> logits;  // [V] for the next token, or empty when next_id holds it
    int32_t next_id = -1;       // >= 0: the next token, chosen by decode_greedy (a greedy sampler)
    int64_t generated = 0;
    std::chrono::steady_clock::time_point arrival, last_token;
    bool prefilling() const { return prefilled < static_cast<int64_t>(prompt.size()); }
  };
  void loop();
  // Under mu_: how many preempted and waiting requests the free slots and KV blocks take now.
  void choose_admissions(size_t& n_preempted, std::vector<Waiting>& admitted);
  void admit(size_t n_preempted, std::vector<Waiting>& batch);
  int64_t kv_room() const;  // free KV blocks less what admitted prompts will still take (paged)
  void prefill_step();
  void step();
  void preempt_for_decode(std::vector<size_t>& cont);
  void preempt(Running& r);
  void publish_load();  // metrics' running / waiting (under mu_)
  void end(Running& r, const std::string& reason, const std::string& error = "");
  void end_unslotted(Running& r, const std::string& reason, const std::string& error = "");

  runtime::DecodeBackend& backend_;
  SchedulerOptions opt_;
  Metrics& metrics_;
  const int num_slots_;
  const int64_t chunk_budget_;  // prompt tokens per step (max_batched_tokens resolved; ≥ 1)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Waiting> waiting_;  // guarded by mu_
  bool stopping_ = false, drain_ = false;
  int64_t num_running_ = 0;    // admitted and not yet ended, preempted ones included (guarded by mu_)
  int64_t num_preempted_ = 0;  // of those, preempted and waiting to be prefilled again (guarded by mu_)
  // Engine thread only:
  const bool paged_;             // the backend's KV is paged (kv_block_tokens() > 0)
  std::vector<Running> running_;
  std::deque<Running> preempted_;  // oldest preemption first; admitted before waiting_
  std::vector<char> slot_busy_;  // [num_slots]
  std::thread thread_;
};

}  // namespace moesq::serve

// scheduler.h: the engine thread's loop. The waiting queue is the only state shared with other
// threads (under mu_); running sequences and slots belong to the engine thread.
#include "serve/scheduler.h"

#include <algorithm>
#include <exception>
#include <limits>

namespace moesq::serve {

using Clock = std::chrono::steady_clock;

namespace {
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// SchedulerOptions::max_batched_tokens resolved: never above what one backend forward takes.
int64_t chunk_budget(const SchedulerOptions& o, const runtime::DecodeBackend& b) {
  MOESQ_CHECK(o.max_batched_tokens >= 0, "--max-num-batched-tokens: ", o.max_batched_tokens, " must be >= 0");
  const int64_t cap = b.max_prefill_tokens() > 0 ? b.max_prefill_tokens() : std::numeric_limits<int64_t>::max();
  return o.max_batched_tokens > 0 ? std::min(o.max_batched_tokens, cap) : cap;
}
}  // namespace

Stream::Chunk Stream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout, [&] { return !pending_.empty() || done_; });
  Chunk c;
  c.tokens.swap(pending_);
  c.done = done_;
  c.finish_reason = reason_;
  c.error = error_;
  return c;
}

void Stream::cancel() {
  std::lock_guard<std::mutex> lk(mu_);
  cancel_ = true;
}

bool Stream::cancelled() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cancel_;
}

void Stream::push(int32_t token) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.push_back(token);
  }
  cv_.notify_all();
}

void Stream::finish(const std::string& reason, const std::string& error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_) return;
    done_ = true, reason_ = reason, error_ = error;
  }
  cv_.notify_all();
}

Scheduler::Scheduler(runtime::DecodeBackend& backend, const SchedulerOptions& opt, Metrics& metrics)
    : backend_(backend), opt_(opt), metrics_(metrics), num_slots_(backend.num_slots()),
      chunk_budget_(chunk_budget(opt, backend)), paged_(backend.kv_block_tokens() > 0),
      slot_busy_(static_cast<size_t>(backend.num_slots()), 0) {
  MOESQ_CHECK(num_slots_ >= 1, "scheduler: the decode backend has no slots");
  MOESQ_CHECK(opt_.max_queue >= 0, "--max-queue: ", opt_.max_queue, " must be >= 0");
  MOESQ_CHECK(!paged_ || backend.kv_block_tokens() == runtime::kKvBlockTokens, "scheduler: the backend's KV blocks of ",
              backend.kv_block_tokens(), " tokens are not the ", runtime::kKvBlockTokens, " this scheduler counts");
  metrics_.set_load(0, 0, num_slots_);
  if (paged_) metrics_.set_kv_usage(0, backend.kv_blocks());
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(false); }

std::shared_ptr<Stream> Scheduler::submit(GenRequest req) {
  MOESQ_CHECK(!req.prompt.empty(), "scheduler: the prompt is empty");
  MOESQ_CHECK(req.stop.max_new_tokens >= 1, "scheduler: max_new_tokens ", req.stop.max_new_tokens, " must be >= 1");
  runtime::check_sampler_options(req.sampling);
  auto stream = std::make_shared<Stream>();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) throw SchedulerBusy("the server is shutting down");
    // Free slots take requests at once; beyond them, max_queue may wait.
    const int64_t capacity = opt_.max_queue + (num_slots_ - num_running_);
    if (static_cast<int64_t>(waiting_.size()) >= capacity)
      throw SchedulerBusy("the waiting queue is full (" + std::to_string(waiting_.size()) + " requests wait, " +
                          std::to_string(num_running_) + " run; --max-queue " + std::to_string(opt_.max_queue) + ")");
    waiting_.push_back(Waiting{std::move(req), stream, Clock::now()});
    publish_load();
  }
  cv_.notify_all();
  return stream;
}

void Scheduler::shutdown(bool drain) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stopping_) stopping_ = true, drain_ = drain;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::publish_load() {
  metrics_.set_load(num_running_ - num_preempted_, static_cast<int64_t>(waiting_.size()) + num_preempted_, num_slots_);
}

void Scheduler::loop() {
  for (;;) {
    // A preempted request whose client went away ends here (it holds no slot and no KV).
    for (auto it = preempted_.begin(); it != preempted_.end();) {
      if (!it->stream->cancelled()) {
        ++it;
        continue;
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        --num_preempted_;
      }
      end_unslotted(*it, "cancelled");
      it = preempted_.erase(it);
    }
    std::vector<Waiting> admitted;
    size_t n_preempted = 0;
    {
      std::unique_lock<std::mutex> lk(mu_);
      const auto free_slot = [&] { return std::find(slot_busy_.begin(), slot_busy_.end(), 0) != slot_busy_.end(); };
      cv_.wait(lk, [&] {
        return stopping_ || !running_.empty() || !preempted_.empty() || (!waiting_.empty() && free_slot());
      });
      if (stopping_ && !drain_) {
        for (Waiting& w : waiting_) w.stream->finish("cancelled");
        waiting_.clear();
        for (Running& r : running_) r.stream->cancel();
        for (Running& r : preempted_) r.stream->cancel();
      }
      if (stopping_ && waiting_.empty() && running_.empty() && preempted_.empty()) return;
      choose_admissions(n_preempted, admitted);
      publish_load();
    }
    admit(n_preempted, admitted);
    step();
  }
}

int64_t Scheduler::kv_room() const {
  int64_t room = backend_.kv_free_blocks();
  for (const Running& r : running_)
    if (!r.ended && r.prefilling())
      room -= runtime::kv_blocks_for(static_cast<int64_t>(r.prompt.size())) - runtime::kv_blocks_for(r.prefilled);
  return room;
}

// Preempted requests first, oldest preemption first, then the waiting queue in arrival order, while a
// slot is free and (paged KV) the blocks left after the admitted prompts and a 1 % watermark hold the
// next one's prompt; the first that does not fit stops the admission (first come, first served). With
// nothing running, the first candidate goes in whatever it needs: alone it fits the pool (or meets the
// backend's error, a prompt longer than max_len).
void Scheduler::choose_admissions(size_t& n_preempted, std::vector<Waiting>& admitted) {
  int64_t free_slots = std::count(slot_busy_.begin(), slot_busy_.end(), 0);
  int64_t room = paged_ ? kv_room() - backend_.kv_blocks() / 100 : 0;
  bool idle = running_.empty();
  const auto take = [&](size_t tokens) {
    if (free_slots == 0) return false;
    const int64_t blocks = paged_ ? runtime::kv_blocks_for(static_cast<int64_t>(tokens)) : 0;
    if (!idle && blocks > room) return false;
    --free_slots, room -= blocks, idle = false;
    return true;
  };
  while (n_preempted < preempted_.size() && take(preempted_[n_preempted].prompt.size())) ++n_preempted;
  if (n_preempted < preempted_.size()) return;
  while (!waiting_.empty() && take(waiting_.front().req.prompt.size())) {
    admitted.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    ++num_running_;
  }
}

// Gives the chosen requests free slots; their prompts go in by prefill_step, chunk by chunk.
void Scheduler::admit(size_t n_preempted, std::vector<Waiting>& batch) {
  const auto give_slot = [&](Running& r) {
    const auto free_slot = std::find(slot_busy_.begin(), slot_busy_.end(), 0);
    r.slot = static_cast<int>(free_slot - slot_busy_.begin());
    slot_busy_[r.slot] = 1;
  };
  if (n_preempted > 0) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      num_preempted_ -= static_cast<int64_t>(n_preempted);
      publish_load();
    }
    for (size_t i = 0; i < n_preempted; ++i) {
      Running r = std::move(preempted_.front());
      preempted_.pop_front();
      if (r.stream->cancelled()) {
        end_unslotted(r, "cancelled");
        continue;
      }
      give_slot(r);
      running_.push_back(std::move(r));
    }
  }
  for (Waiting& w : batch) {
    Running r(w.req.sampling);
    r.stop = w.req.stop;
    r.stream = w.stream;
    r.arrival = r.last_token = w.arrival;
    if (w.stream->cancelled()) {
      end_unslotted(r, "cancelled");
      continue;
    }
    give_slot(r);
    r.prompt = std::move(w.req.prompt);
    r.history = r.prompt;
    running_.push_back(std::move(r));
  }
}

// The next pieces of the prompts being prefilled, first admitted first, at most chunk_budget_ tokens in
// all, in one prefill_chunks (whole prompts where they fit: see below). When that call fails, each of
// its sequences is prefilled again alone from its first token (a start chunk up to where it would have
// reached), so that only the one at fault ends with the error; the others lose nothing, the chunking
// changes no bits. With paged KV a chunk is also cut to the free blocks (a chunk that gets none stops
// the step's prefill: first come, first served).
void Scheduler::prefill_step() {
  std::vector<size_t> idx;  // into running_
  std::vector<runtime::PrefillChunk> chunks;
  int64_t budget = chunk_budget_;
  int64_t free_blocks = paged_ ? backend_.kv_free_blocks() : 0;
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Running& r = running_[i];
    if (r.ended || !r.prefilling()) continue;
    if (r.stream->cancelled()) {
      end(r, "cancelled");
      continue;
    }
    const int64_t left = static_cast<int64_t>(r.prompt.size()) - r.prefilled;
    // A prompt that fits one step's budget is never cut: it waits for the next step (first come, first
    // served: the ones behind it wait too). Only a prompt longer than the budget goes in pieces.
    if (r.prefilled == 0 && left <= chunk_budget_ && left > budget) break;
    int64_t n = std::min(left, budget);
    if (paged_) {  // the tokens its own last block and the free blocks still hold
      const int64_t held = runtime::kv_blocks_for(r.prefilled);
      n = std::min(n, (held + free_blocks) * runtime::kKvBlockTokens - r.prefilled);
      if (n <= 0) break;
      free_blocks -= runtime::kv_blocks_for(r.prefilled + n) - held;
    }
    budget -= n;
    chunks.push_back({r.slot, std::vector<int32_t>(r.prompt.begin() + r.prefilled, r.prompt.begin() + r.prefilled + n),
                      r.prefilled == 0});
    idx.push_back(i);
  }
  if (chunks.empty()) return;
  const int64_t V = backend_.vocab_size();
  std::vector<float> z;
  try {
    z = backend_.prefill_chunks(chunks);
    MOESQ_CHECK(static_cast<int64_t>(z.size()) == static_cast<int64_t>(chunks.size()) * V, "scheduler: the backend ",
                "returned ", z.size(), " prefill logits for ", chunks.size(), " chunks of ", V);
  } catch (const std::exception&) {
    z.clear();
  }
  for (size_t k = 0; k < chunks.size(); ++k) {
    Running& r = running_[idx[k]];
    const int64_t upto = r.prefilled + static_cast<int64_t>(chunks[k].tokens.size());
    std::vector<float> row;
    if (!z.empty()) {
      row.assign(z.begin() + static_cast<int64_t>(k) * V, z.begin() + static_cast<int64_t>(k + 1) * V);
    } else {
      try {
        row = backend_.prefill_chunks({{r.slot, std::vector<int32_t>(r.prompt.begin(), r.prompt.begin() + upto), true}});
        MOESQ_CHECK(static_cast<int64_t>(row.size()) == V, "scheduler: the backend returned ", row.size(),
                    " prefill logits for one chunk of ", V);
      } catch (const std::exception& e) {
        end(r, "error", e.what());
        continue;
      }
    }
    r.prefilled = upto;
    if (r.prefilling()) continue;
    if (!r.recompute) metrics_.add_prompt_tokens(static_cast<int64_t>(r.prompt.size()));
    r.recompute = false;
    r.logits = std::move(row);
    std::vector<int32_t>().swap(r.prompt);
    r.prefilled = 0;  // prompt empty: not prefilling
  }
}

// A request that never held a slot (cancelled while waiting, or its prefill failed).
void Scheduler::end_unslotted(Running& r, const std::string& reason, const std::string& error) {
  r.slot = -1;
  end(r, reason, error);
}

// The slot is counted free before the client hears of the end: a client that submits again at once
// must find room.
void Scheduler::end(Running& r, const std::string& reason, const std::string& error) {
  if (r.slot >= 0) {
    slot_busy_[r.slot] = 0;
    backend_.release(r.slot);  // its KV blocks back to the pool (paged)
  }
  r.ended = true;
  {
    std::lock_guard<std::mutex> lk(mu_);
    --num_running_;
    publish_load();
  }
  metrics_.request_finished(reason);
  metrics_.e2e_s.observe(since(r.arrival));
  r.stream->finish(reason, error);
}

// See scheduler.h (paged KV). The victim's sampled token is in its history already, so the prefill of
// its history ends where its decode would have: the logits for the token after it.
void Scheduler::preempt(Running& r) {
  backend_.release(r.slot);
  slot_busy_[r.slot] = 0;
  r.slot = -1;
  if (!r.prefilling()) r.recompute = true;  // its prompt was counted when it first went in
  r.prompt = r.history;
  r.prefilled = 0;
  r.logits.clear();
  r.next_id = -1;
  r.preempted = true;
  metrics_.add_preemption();
  std::lock_guard<std::mutex> lk(mu_);
  ++num_preempted_;
  publish_load();
}

// Before the decode: while the rows that go on (cont) need more new KV blocks than are free, preempt
// the sequence admitted last (the end of running_) and drop it from cont.
void Scheduler::preempt_for_decode(std::vector<size_t>& cont) {
  for (;;) {
    int64_t need = 0;
    for (size_t i : cont) {
      const int64_t n = static_cast<int64_t>(running_[i].history.size());  // the slot holds n - 1 tokens
      need += runtime::kv_blocks_for(n) - runtime::kv_blocks_for(n - 1);
    }
    if (need <= backend_.kv_free_blocks()) return;
    size_t victim = running_.size(), active = 0;
    for (size_t i = 0; i < running_.size(); ++i)
      if (!running_[i].ended && !running_[i].preempted) ++active, victim = i;
    if (active <= 1) return;  // alone it fits the pool; else the decode's KvCacheFull ends it with that error
    preempt(running_[victim]);
    cont.erase(std::remove(cont.begin(), cont.end(), victim), cont.end());
  }
}

// The prompts' next chunks, then Generator::step's order for every sequence whose prompt is in:
// sample, stop?, then one decode of the sequences that go on.
void Scheduler::step() {
  prefill_step();
  const int64_t V = backend_.vocab_size();
  std::vector<int32_t> slots, tokens;
  std::vector<size_t> cont;  // indices into running_
  for (size_t i = 0; i < running_.size(); ++i) {
    Running& r = running_[i];
    if (r.ended) continue;
    if (r.stream->cancelled()) {
      end(r, "cancelled");
      continue;
    }
    if (r.prefilling()) continue;
    const int32_t t = r.next_id >= 0 ? r.next_id : r.sampler.next(r.logits.data(), V);
    r.next_id = -1;
    const auto now = Clock::now();
    if (r.generated == 0)
      metrics_.ttft_s.observe(std::chrono::duration<double>(now - r.arrival).count());
    else
      metrics_.itl_s.observe(std::chrono::duration<double>(now - r.last_token).count());
    r.last_token = now;
    ++r.generated;
    r.history.push_back(t);
    metrics_.add_generation_tokens(1);
    r.stream->push(t);
    if (std::find(r.stop.stop_ids.begin(), r.stop.stop_ids.end(), t) != r.stop.stop_ids.end()) {
      end(r, "stop");
    } else if (r.generated >= r.stop.max_new_tokens) {
      end(r, "length");
    } else {
      cont.push_back(i);
    }
  }
  if (paged_) preempt_for_decode(cont);
  for (size_t i : cont) slots.push_back(running_[i].slot), tokens.push_back(running_[i].history.back());
  // One decode of the rows that go on: ids only when every one is greedy, else logits for the samplers.
  const bool all_greedy = std::all_of(cont.begin(), cont.end(), [&](size_t i) { return running_[i].sampler.greedy(); });
  if (!cont.empty()) {
    try {
      if (all_greedy) {
        const std::vector<int32_t> ids = backend_.decode_greedy(slots, tokens);
        MOESQ_CHECK(ids.size() == cont.size(), "scheduler: the backend returned ", ids.size(), " greedy tokens for ",
                    cont.size(), " rows");
        for (size_t b = 0; b < cont.size(); ++b) {
          MOESQ_CHECK(ids[b] >= 0 && ids[b] < V, "scheduler: the backend's greedy token ", ids[b], " is outside [0, ",
                      V, ")");
          running_[cont[b]].next_id = ids[b];
          running_[cont[b]].logits.clear();
        }
      } else {
        const std::vector<float> z = backend_.decode(slots, tokens);
        MOESQ_CHECK(static_cast<int64_t>(z.size()) == static_cast<int64_t>(cont.size()) * V, "scheduler: the backend ",
                    "returned ", z.size(), " logits for ", cont.size(), " rows of ", V);
        for (size_t b = 0; b < cont.size(); ++b)
          running_[cont[b]].logits.assign(z.begin() + static_cast<int64_t>(b) * V,
                                          z.begin() + static_cast<int64_t>(b + 1) * V);
      }
    } catch (const std::exception& e) {
      for (size_t i : cont) end(running_[i], "error", e.what());
    }
  }
  std::vector<Running> rest;
  rest.reserve(running_.size());
  for (Running& r : running_) {
    if (r.ended) continue;
    if (r.preempted) {
      r.preempted = false;
      preempted_.push_back(std::move(r));
    } else {
      rest.push_back(std::move(r));
    }
  }
  running_ = std::move(rest);
  if (paged_) metrics_.set_kv_usage(backend_.kv_blocks() - backend_.kv_free_blocks(), backend_.kv_blocks());
}

}  // namespace moesq::serve

// scheduler.h: the engine thread's loop. The waiting queue is the only state shared with other
// threads (under mu_); running sequences and slots belong to the engine thread.
#include "serve/scheduler.h"

#include <algorithm>
#include <exception>

namespace moesq::serve {

using Clock = std::chrono::steady_clock;

namespace {
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
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
      slot_busy_(static_cast<size_t>(backend.num_slots()), 0) {
  MOESQ_CHECK(num_slots_ >= 1, "scheduler: the decode backend has no slots");
  MOESQ_CHECK(opt_.max_queue >= 0, "--max-queue: ", opt_.max_queue, " must be >= 0");
  metrics_.set_load(0, 0, num_slots_);
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
    metrics_.set_load(num_running_, static_cast<int64_t>(waiting_.size()), num_slots_);
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

void Scheduler::loop() {
  for (;;) {
    std::vector<Waiting> admitted;
    {
      std::unique_lock<std::mutex> lk(mu_);
      const auto free_slots = [&] { return num_slots_ - num_running_; };
      cv_.wait(lk, [&] { return stopping_ || !running_.empty() || (!waiting_.empty() && free_slots() > 0); });
      if (stopping_ && !drain_) {
        for (Waiting& w : waiting_) w.stream->finish("cancelled");
        waiting_.clear();
        for (Running& r : running_) r.stream->cancel();
      }
      if (stopping_ && waiting_.empty() && running_.empty()) return;
      while (!waiting_.empty() && free_slots() > 0) {
        admitted.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        ++num_running_;
      }
      metrics_.set_load(num_running_, static_cast<int64_t>(waiting_.size()), num_slots_);
    }
    admit(admitted);
    step();
  }
}

// Prefills the admitted requests into free slots, all in one prefill_batch (their first tokens are
// sampled by the next step). When the batch fails, each request is prefilled alone, so that only the
// one at fault ends with the error.
void Scheduler::admit(std::vector<Waiting>& batch) {
  std::vector<Running> fresh;
  std::vector<int32_t> slots;
  std::vector<std::vector<int32_t>> prompts;
  for (Waiting& w : batch) {
    Running r{-1, runtime::Sampler(w.req.sampling), w.req.stop, w.stream, {}, -1, 0, w.arrival, w.arrival};
    if (w.stream->cancelled()) {
      end_unslotted(r, "cancelled");
      continue;
    }
    const auto free_slot = std::find(slot_busy_.begin(), slot_busy_.end(), 0);
    r.slot = static_cast<int>(free_slot - slot_busy_.begin());
    slot_busy_[r.slot] = 1;  // taken for this batch; given back below if its prefill fails
    slots.push_back(r.slot);
    prompts.push_back(std::move(w.req.prompt));
    fresh.push_back(std::move(r));
  }
  if (fresh.empty()) return;
  const int64_t V = backend_.vocab_size();
  std::vector<float> z;
  try {
    z = backend_.prefill_batch(slots, prompts);
    MOESQ_CHECK(static_cast<int64_t>(z.size()) == static_cast<int64_t>(fresh.size()) * V, "scheduler: the backend ",
                "returned ", z.size(), " prefill logits for ", fresh.size(), " prompts of ", V);
  } catch (const std::exception&) {
    z.clear();
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    Running& r = fresh[i];
    if (!z.empty()) {
      r.logits.assign(z.begin() + static_cast<int64_t>(i) * V, z.begin() + static_cast<int64_t>(i + 1) * V);
    } else {
      try {
        r.logits = backend_.prefill(r.slot, prompts[i]);
      } catch (const std::exception& e) {
        slot_busy_[r.slot] = 0;
        end_unslotted(r, "error", e.what());
        continue;
      }
    }
    metrics_.add_prompt_tokens(static_cast<int64_t>(prompts[i].size()));
    running_.push_back(std::move(r));
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
  if (r.slot >= 0) slot_busy_[r.slot] = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    --num_running_;
    metrics_.set_load(num_running_, static_cast<int64_t>(waiting_.size()), num_slots_);
  }
  metrics_.request_finished(reason);
  metrics_.e2e_s.observe(since(r.arrival));
  r.stream->finish(reason, error);
}

// Generator::step's order: sample, stop?, then one decode of the sequences that go on.
void Scheduler::step() {
  const int64_t V = backend_.vocab_size();
  std::vector<int32_t> slots, tokens;
  std::vector<size_t> cont;  // indices into running_
  std::vector<char> gone(running_.size(), 0);
  for (size_t i = 0; i < running_.size(); ++i) {
    Running& r = running_[i];
    if (r.stream->cancelled()) {
      end(r, "cancelled"), gone[i] = 1;
      continue;
    }
    const int32_t t = r.next_id >= 0 ? r.next_id : r.sampler.next(r.logits.data(), V);
    r.next_id = -1;
    const auto now = Clock::now();
    if (r.generated == 0)
      metrics_.ttft_s.observe(std::chrono::duration<double>(now - r.arrival).count());
    else
      metrics_.itl_s.observe(std::chrono::duration<double>(now - r.last_token).count());
    r.last_token = now;
    ++r.generated;
    metrics_.add_generation_tokens(1);
    r.stream->push(t);
    if (std::find(r.stop.stop_ids.begin(), r.stop.stop_ids.end(), t) != r.stop.stop_ids.end()) {
      end(r, "stop"), gone[i] = 1;
    } else if (r.generated >= r.stop.max_new_tokens) {
      end(r, "length"), gone[i] = 1;
    } else {
      slots.push_back(r.slot), tokens.push_back(t), cont.push_back(i);
    }
  }
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
      for (size_t i : cont) end(running_[i], "error", e.what()), gone[i] = 1;
    }
  }
  std::vector<Running> rest;
  rest.reserve(running_.size());
  for (size_t i = 0; i < running_.size(); ++i)
    if (!gone[i]) rest.push_back(std::move(running_[i]));
  running_ = std::move(rest);
}

}  // namespace moesq::serve

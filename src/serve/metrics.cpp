// metrics.h: counters under one mutex, each histogram under its own.
#include "serve/metrics.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace moesq::serve {

namespace {
std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}
const std::vector<double> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                            0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++n_;
}

int64_t Histogram::count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return n_;
}

std::string Histogram::text(const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::ostringstream os;
  os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    os << name << "_bucket{le=\"" << num(bounds_[i]) << "\"} " << cum << "\n";
  }
  cum += counts_.back();
  os << name << "_bucket{le=\"+Inf\"} " << cum << "\n" << name << "_sum " << num(sum_) << "\n" << name << "_count " << n_ << "\n";
  return os.str();
}

Metrics::Metrics() : ttft_s(kLatencyBounds), itl_s(kLatencyBounds), e2e_s(kLatencyBounds) {
  for (const char* r : {"stop", "length", "cancelled", "error"}) finished_.emplace_back(r, 0);
}

void Metrics::request_finished(const std::string& finish_reason) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [r, n] : finished_)
    if (r == finish_reason) return void(++n);
  finished_.emplace_back(finish_reason, 1);
}

void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  prompt_tokens_ += n;
}

void Metrics::add_generation_tokens(int64_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  generation_tokens_ += n;
}

void Metrics::set_load(int64_t running, int64_t waiting, int64_t num_slots) {
  std::lock_guard<std::mutex> lk(mu_);
  running_ = running, waiting_ = waiting, num_slots_ = num_slots;
}

void Metrics::set_kv_usage(int64_t used_blocks, int64_t blocks) {
  std::lock_guard<std::mutex> lk(mu_);
  kv_used_ = used_blocks, kv_blocks_ = blocks;
}

void Metrics::add_preemption() {
  std::lock_guard<std::mutex> lk(mu_);
  ++preemptions_;
}

std::string Metrics::prometheus_text() const {
  std::ostringstream os;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto one = [&](const char* name, const char* type, const char* help, double v) {
      os << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << num(v) << "\n";
    };
    os << "# HELP moesq:request_success_total Finished requests by finish reason.\n"
          "# TYPE moesq:request_success_total counter\n";
    for (const auto& [r, n] : finished_) os << "moesq:request_success_total{finished_reason=\"" << r << "\"} " << n << "\n";
    one("moesq:prompt_tokens_total", "counter", "Prefilled prompt tokens.", static_cast<double>(prompt_tokens_));
    one("moesq:generation_tokens_total", "counter", "Generated tokens.", static_cast<double>(generation_tokens_));
    one("moesq:num_requests_running", "gauge", "Sequences holding a KV slot.", static_cast<double>(running_));
    one("moesq:num_requests_waiting", "gauge", "Requests queued for a KV slot (preempted ones included).", static_cast<double>(waiting_));
    if (kv_blocks_ > 0)
      one("moesq:kv_cache_usage_perc", "gauge", "Fraction of the paged KV cache's blocks held by sequences.",
          static_cast<double>(kv_used_) / static_cast<double>(kv_blocks_));
    else
      one("moesq:kv_cache_usage_perc", "gauge", "Fraction of KV slots in use (each slot holds --max-model-len tokens).",
          num_slots_ ? static_cast<double>(running_) / static_cast<double>(num_slots_) : 0.0);
    one("moesq:num_preemptions_total", "counter", "Sequences preempted for KV blocks (prefilled again later).",
        static_cast<double>(preemptions_));
  }
  os << ttft_s.text("moesq:time_to_first_token_seconds", "Time from arrival to the first generated token.");
  os << itl_s.text("moesq:inter_token_latency_seconds", "Time between two generated tokens of one request.");
  os << e2e_s.text("moesq:e2e_request_latency_seconds", "Time from arrival to the last token.");
  return os.str();
}

}  // namespace moesq::serve

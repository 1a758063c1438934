// Server metrics for GET /metrics in the Prometheus text format (version 0.0.4): request counts by
// finish reason, prompt / generated token counters, running and waiting sequences, KV usage, preemptions,
// and latency histograms (time to first token, inter-token latency, end-to-end). Thread-safe: the
// engine thread records, HTTP threads read. Names follow vLLM's (`moesq:` instead of `vllm:`), so
// dashboards built for it need only the prefix changed.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace moesq::serve {

// A cumulative histogram over fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // "<name>_bucket{le=...} n" lines, _sum and _count.
  std::string text(const std::string& name, const std::string& help) const;
  int64_t count() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // [bounds + 1]: the last is +Inf
  double sum_ = 0.0;
  int64_t n_ = 0;
};

class Metrics {
 public:
  Metrics();
  void request_finished(const std::string& finish_reason);  // stop, length, cancelled, error
  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  void set_load(int64_t running, int64_t waiting, int64_t num_slots);
  // Paged KV: blocks held by sequences of `blocks` (then kv_cache_usage_perc is this fraction, not the
  // slots' one).
  void set_kv_usage(int64_t used_blocks, int64_t blocks);
  void add_preemption();
  Histogram ttft_s, itl_s, e2e_s;
  std::string prometheus_text() const;

 private:
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, running_ = 0, waiting_ = 0, num_slots_ = 0;
  int64_t kv_used_ = 0, kv_blocks_ = 0, preemptions_ = 0;
  std::vector<std::pair<std::string, int64_t>> finished_;  // by finish reason
};

}  // namespace moesq::serve

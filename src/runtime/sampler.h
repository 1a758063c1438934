// Next-token choice for `moesq generate`: greedy (temperature 0: argmax, lowest id on ties) or
// temperature + nucleus (top-p) sampling from a seeded generator, identical on the CPU and GPU paths
// (the logits come back to the host either way).
#pragma once
#include <cstdint>
#include <random>

namespace moesq::runtime {

struct SamplerOptions {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  uint64_t seed = 0;
};

// Error (naming the flag): temperature < 0 or not finite, top_p outside (0, 1].
void check_sampler_options(const SamplerOptions& opt);

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& opt);  // Error: check_sampler_options
  int32_t next(const float* logits, int64_t V);  // logits [V]
  // temperature 0: next() is the argmax and draws nothing from the generator (runtime::greedy_rows).
  bool greedy() const { return opt_.temperature == 0.0f; }

 private:
  SamplerOptions opt_;
  std::mt19937_64 rng_;
};

}  // namespace moesq::runtime

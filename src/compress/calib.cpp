#include "compress/calib.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>

#include "core/error.h"
#include "core/progress.h"
#include "core/threads.h"
#include "core/blas_threads.h"
#include "model/kv_decoder.h"

namespace moesq::compress {

int64_t CalibSet::tokens() const {
  int64_t t = 0;
  for (const auto& s : sequences) t += static_cast<int64_t>(s.size());
  return t;
}

CalibSet calib_from_files(const std::vector<std::string>& files, int64_t vocab_size, io::TextSplit split,
                          int64_t num_samples, int64_t seq_len, const io::Tokenizer* text_tokenizer) {
  MOESQ_CHECK(num_samples > 0, "--calib-samples must be positive (got ", num_samples, ")");
  MOESQ_CHECK(seq_len >= 2, "--seq-len must be at least 2 (got ", seq_len, ")");
  MOESQ_CHECK(!files.empty(), "--calib: no files given");
  std::vector<std::vector<int32_t>> data;
  int64_t total_windows = 0;
  for (const auto& f : files) {
    data.push_back(io::load_tokens(f, vocab_size, split, text_tokenizer));
    const int64_t w = static_cast<int64_t>(data.back().size()) / seq_len;
    MOESQ_CHECK(w > 0, "calibration file ", f, " holds ", data.back().size(),
                " tokens (after the split), fewer than one window of --seq-len ", seq_len);
    total_windows += w;
  }
  CalibSet set;
  set.source = "files:";
  for (const auto& f : files) set.source += " " + f;
  // Window i of the global list (files concatenated, whole windows only) for evenly spaced picks.
  const int64_t take = std::min(num_samples, total_windows);
  for (int64_t j = 0; j < take; ++j) {
    int64_t idx = (j * total_windows) / take;
    for (size_t f = 0; f < data.size(); ++f) {
      const int64_t w = static_cast<int64_t>(data[f].size()) / seq_len;
      if (idx < w) {
        set.sequences.emplace_back(data[f].begin() + idx * seq_len, data[f].begin() + (idx + 1) * seq_len);
        break;
      }
      idx -= w;
    }
  }
  return set;
}

CalibSet calib_from_model(const model::DecoderModel& m, int64_t num_samples, int64_t seq_len, uint64_t seed) {
  MOESQ_CHECK(num_samples > 0, "--calib-samples must be positive (got ", num_samples, ")");
  MOESQ_CHECK(seq_len >= 2, "--seq-len must be at least 2 (got ", seq_len, ")");
  // Checked before anything is allocated (10^11 samples was an uncaught std::bad_alloc); the bound
  // is 8192 x the default 2048 x 128 tokens.
  constexpr int64_t kMaxTokens = int64_t{1} << 31;
  MOESQ_CHECK(num_samples <= kMaxTokens / seq_len, "--calib-samples ", num_samples, " x --seq-len ", seq_len,
              " is more than the ", kMaxTokens, " tokens data-free calibration samples at most");
  CalibSet set;
  set.source = "sampled from the model (data-free, seed " + std::to_string(seed) + ")";
  set.sequences.resize(static_cast<size_t>(num_samples));
  const int64_t V = m.spec().vocab_size;
  std::atomic<int64_t> done{0};
  model::ForwardOptions fo = m.default_forward_options();
  fo.threads = 1;  // one sequence per thread
  ScopedBlasSingleThread single_blas;
  // One sequence per task, each with its own generator seeded from (seed, index): the result does not
  // depend on the thread count.
  parallel_for(num_samples, [&](int64_t i) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) + 1);
    model::KvDecoder dec(m, seq_len, fo);
    std::vector<int32_t>& seq = set.sequences[static_cast<size_t>(i)];
    seq.push_back(static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, V - 1)(rng)));
    while (static_cast<int64_t>(seq.size()) < seq_len) {
      const std::vector<float> logits = dec.step(seq.back());  // [V]
      const float mx = *std::max_element(logits.begin(), logits.end());
      std::vector<double> p(logits.size());
      for (size_t v = 0; v < p.size(); ++v) p[v] = std::exp(static_cast<double>(logits[v] - mx));
      std::discrete_distribution<int32_t> pick(p.begin(), p.end());
      seq.push_back(pick(rng));
    }
    const int64_t d = ++done;
    progress("calib", "sampled sequence " + std::to_string(d) + "/" + std::to_string(num_samples));
  });
  return set;
}

}  // namespace moesq::compress

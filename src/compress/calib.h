// Calibration data for Algorithm 1: token sequences from files (text or .npy) or, when none are
// given, sampled from the model itself (data-free calibration: no corpus ships with moesq).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/tokens.h"
#include "model/decoder.h"

namespace moesq::compress {

struct CalibSet {
  std::vector<std::vector<int32_t>> sequences;  // each [seq_len]
  std::string source;                           // "files: a, b" or "sampled from the model (seed S)"
  int64_t tokens() const;
};

// Takes `num_samples` windows of `seq_len` tokens spread evenly over the concatenated files (after
// the split), so every file contributes in proportion to its size. Errors name the file (empty,
// shorter than one window) or the flag (--calib-samples, --seq-len). Text files are encoded by
// `text_tokenizer` (nullptr: bytes are tokens; see io::load_tokens).
CalibSet calib_from_files(const std::vector<std::string>& files, int64_t vocab_size, io::TextSplit split,
                          int64_t num_samples, int64_t seq_len, const io::Tokenizer* text_tokenizer = nullptr);

// Samples `num_samples` sequences of `seq_len` tokens from the model (temperature 1, first token
// uniform over the vocabulary), deterministically from `seed` (whatever the thread count). Uses the
// incremental decoder; sequences are sampled in parallel, each forward single-threaded. Errors name
// --calib-samples / --seq-len when num_samples x seq_len exceeds 2^31 tokens.
CalibSet calib_from_model(const model::DecoderModel& m, int64_t num_samples, int64_t seq_len, uint64_t seed);

}  // namespace moesq::compress

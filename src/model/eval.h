// Perplexity-style evaluation of a Qwen3-MoE checkpoint on token files (`moesq eval`, the demo):
// each file is cut into windows of seq_len tokens, every token after the first of a window is
// predicted, and the result is the mean negative log-likelihood in nats per predicted token.
// The non-obvious decision: windows are evaluated in parallel (one thread per window, the forward
// itself single-threaded), and per-window sums are reduced in window order, so the result is
// bitwise independent of the thread count.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/tokens.h"
#include "model/decoder.h"

namespace moesq::model {

enum class ActQuant { Auto, None, Nvfp4 };  // Auto: what the checkpoint says (W4A4 if compressed)

const char* act_quant_name(ActQuant a);            // "auto" | "none" | "nvfp4"
ActQuant parse_act_quant(const std::string& s);    // Error naming --act-quant for other values

struct EvalOptions {
  int64_t seq_len = 512;                // tokens per window
  io::TextSplit split = io::TextSplit::All;
  ActQuant act_quant = ActQuant::Auto;
  int threads = 0;                      // windows evaluated at once; 0 = moesq::num_threads()
  bool allow_mixed = false;             // --allow-mixed: load a half-compressed checkpoint (LoadOptions)
  // Encodes text data files (io::load_tokens); nullopt: a text file's bytes are its tokens.
  // evaluate_checkpoint / evaluate_checkpoint_cuda fill it from the checkpoint (io::text_tokenizer_for).
  std::optional<io::Tokenizer> text_tokenizer;
};

struct FileEval {
  std::string path;
  int64_t tokens = 0;     // tokens loaded from the file (after the split)
  int64_t predicted = 0;  // predicted tokens (tokens − number of windows)
  int64_t windows = 0;
  double nats_per_token = 0.0;
};

struct EvalResult {
  std::string model;          // checkpoint directory
  std::string act_quant;      // "none" | "nvfp4" — what was actually applied
  int act_block = 0;          // activation block size when act_quant is nvfp4
  std::string expert_format;  // "bf16" | "paired-4:8-nvfp4" | "nvfp4"
  int64_t seq_len = 0;
  std::string split;
  int64_t predicted = 0;
  double nats_per_token = 0.0;  // mean over ALL predicted tokens of all files
  double seconds = 0.0;         // wall time of the evaluation (loading excluded)
  std::vector<FileEval> files;
};

// Σ nll (nats) of each window and its predicted-token count, windows evaluated in parallel
// (`threads`, 0 = all), each forward single-threaded (fo.threads is ignored); results in window
// order, so any reduction of them in that order is independent of the thread count.
std::vector<double> window_nll_sums(const DecoderModel& model, const std::vector<std::vector<int32_t>>& windows,
                                    const ForwardOptions& fo, int threads, std::vector<int64_t>* predicted);

// Per-file and overall nats/token of `res` from per-window Σ nll `sum` and predicted-token `count`
// (both [windows]) of windows belonging to files `file_of` [windows] (indices into res->files),
// reduced in window order (so the result never depends on how windows were scheduled).
// Error naming `who` if the overall value is not finite.
void reduce_window_sums(EvalResult* res, const std::vector<size_t>& file_of, const std::vector<double>& sum,
                        const std::vector<int64_t>& count, const char* who);

// Forward options of an evaluation: Auto → the checkpoint's default (W4A4 if compressed), None →
// no activation quantization, Nvfp4 → activation quantization with the checkpoint's block (32 on
// a bf16 checkpoint).
ForwardOptions resolve_forward_options(const DecoderModel& model, ActQuant act_quant);

// Evaluates `model` with resolve_forward_options(model, opt.act_quant).
EvalResult evaluate_model(const DecoderModel& model, const std::vector<std::string>& files,
                          const EvalOptions& opt);

// Loads the checkpoint in `dir` and evaluates it (evaluate_model).
EvalResult evaluate_checkpoint(const std::string& dir, const std::vector<std::string>& files,
                               const EvalOptions& opt);

}  // namespace moesq::model

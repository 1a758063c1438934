// Flags shared by `compress` and `demo`: calibration source, SGPTQ, refinement and baseline options.
// The option flags are bound to the library's own option structs (compress::CompressOptions), so each
// default is written once, there; what is left here is the calibration's (a CLI concern) and the
// text form of a few typed options.
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "compress/calib.h"
#include "compress/pipeline.h"

namespace moesq::cli {

struct CompressFlags {
  std::vector<std::string> calib;
  std::string calib_split = "all";
  int64_t calib_samples = 2048;  // 2048 × 128 = 262,144 tokens (docs/RESULTS.md)
  int64_t seq_len = 128;
  int64_t calib_sampled = 0;  // --calib-sampled: sequences sampled from the model added to the --calib files'
  bool strict = false;  // calibration shortfalls are errors, not warnings
  // Every option flag writes into this (--seed into opt.refine.seed, also the data-free sampling
  // seed; --threads into opt.threads). A command's own presets (e.g. `moesq demo`) are set here
  // before add_compress_flags, so --help shows them.
  compress::CompressOptions opt;
  // The text forms of RefineOptions::p, update_A, rule_per_expert and restore_best; add_compress_flags
  // sets their defaults from `opt`.
  std::string objective, update, schedule_scope, select_epoch, targets, gpu_gemm;  // gpu_gemm "": the default (resolve_device)
  // true: epochs / batch / lr_A / lr_V in `opt` are used as they are (a command's own preset, e.g.
  // `moesq demo`), like flags the user gave.
  bool schedule_preset = false;
  // Filled by add_compress_flags: tells which of --epochs/--batch/--lr-a/--lr-v were given.
  const CLI::Option *epochs_opt = nullptr, *batch_opt = nullptr, *lr_a_opt = nullptr, *lr_v_opt = nullptr;
  // The refinement and baseline flag groups (add_compress_flags), for check_flags_apply.
  const CLI::Option_group *refine_group = nullptr, *baseline_group = nullptr;

  // For a command that runs ONE method (`compress`): Error naming the flag when a refinement flag is
  // given with a method that does not refine, or --jsq-* / --obr-* with another method (they were
  // ignored silently). `moesq demo` runs several methods and does not call it.
  void check_flags_apply(const compress::Method& m) const;

  // `opt` for `method` (a --method value), validated (compress::validate).
  compress::CompressOptions options(const std::string& method) const;
  // --calib files (text through the tokenizer of checkpoint `dir`, io::text_tokenizer_for) or, without
  // --calib, sequences sampled from `m`.
  compress::CalibSet calibration(const model::DecoderModel& m, const std::string& dir) const;
};

void add_compress_flags(CLI::App* cmd, CompressFlags& f, bool with_calib_files = true);

// --device auto|cpu|cuda of `compress` and `bench compress` → opt.device and the GPU solvers (cuda when
// asked, or for auto when this build has CUDA, a GPU is present, the method has a GPU path and the
// experts are plain SwiGLU). A GPU refinement without --gpu-gemm (gpu_gemm "") gets the default
// precision, bf16-forward (RefineOptions::bf16_forward + tf32_backward). Errors name the flag: cuda without CUDA or a
// GPU, a CPU-only method, experts the GPU does not implement. (cmd_compress.cpp)
void resolve_device(const std::string& flag, const io::ModelSpec& spec, compress::CompressOptions& opt,
                    const std::string& gpu_gemm);

// The --method help: every row of the method table (compress/method.h) as "name (help)", " | " between
// them, wrapped.
std::string method_help();

}  // namespace moesq::cli

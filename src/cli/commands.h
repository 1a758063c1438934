// Each subcommand lives in its own cmd_<name>.cpp and registers itself on the top-level app.
// The CLI is thin: parse flags, call the library, print text or JSON. Errors are moesq::Error,
// caught in main() → message on stderr, exit code 1.
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "core/error.h"

namespace moesq::cli {

void register_inspect(CLI::App& app);
void register_compress(CLI::App& app);
void register_eval(CLI::App& app);
void register_demo(CLI::App& app);
void register_bench(CLI::App& app);
void register_audit(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_generate(CLI::App& app);  // cmd_generate.cpp
void register_bench_e2e(CLI::App* bench);  // cmd_bench_e2e.cpp, under `bench`
void register_bench_serve(CLI::App* bench);  // cmd_bench_serve.cpp, under `bench`
void register_bench_compress(CLI::App* bench);  // cmd_bench_compress.cpp, under `bench`
void register_export(CLI::App& app);
void register_serve(CLI::App& app);  // cmd_serve.cpp

// --check-finite of the commands that run the GPU engine (generate, eval, serve, bench e2e): one flag,
// one help text, bound to the bool that becomes runtime::EngineOptions::check_finite.
inline CLI::Option* add_check_finite_flag(CLI::App* cmd, bool& on) {
  return cmd->add_flag(
      "--check-finite", on,
      "GPU engine debug check (--device cuda): after the embedding, each layer's attention, router logits, every "
      "expert's gate|up and down outputs and MoE output, and the logits, stop at the first NaN or inf with an error "
      "naming the layer, the stage, the expert and the token (serve: the requests of that step end with it). Costs a "
      "few small kernels per layer and one 8-byte copy per step; off (the default) it costs nothing");
}
// Before any work: --check-finite with another --device than cuda is an error naming the flag.
inline void check_finite_needs_cuda(bool on, const std::string& device) {
  MOESQ_CHECK(!on || device == "cuda", "--check-finite applies to --device cuda only (it checks the GPU engine's "
              "activations; --device is ", device, ")");
}

}  // namespace moesq::cli

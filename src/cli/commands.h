// Each subcommand lives in its own cmd_<name>.cpp and registers itself on the top-level app.
// The CLI is thin: parse flags, call the library, print text or JSON. Errors are moesq::Error,
// caught in main() → message on stderr, exit code 1.
#pragma once
#include <CLI/CLI.hpp>

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

}  // namespace moesq::cli

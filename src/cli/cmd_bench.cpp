// `moesq bench` (e2e: cmd_bench_e2e.cpp; serve: cmd_bench_serve.cpp; compress: cmd_bench_compress.cpp). `moesq bench gemm` points at
// the GPU benchmark program. The timing itself lives in
// bench/bench_gemm.cu (a separate binary, built whenever nvcc is present) so that the CLI never
// touches CUDA: CI machines have nvcc but no GPU, and `moesq` must run there.
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

namespace moesq::cli {

void register_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Benchmarks (GPU programs built next to moesq)");
  cmd->require_subcommand(1);
  register_bench_e2e(cmd);
  register_bench_serve(cmd);
  register_bench_compress(cmd);
  auto* gemm = cmd->add_subcommand("gemm", "Grouped sparse GEMM vs dense peers: explains how to run build/bench_gemm");
  gemm->callback([] {
    std::printf(
        "The grouped sparse GEMM benchmark is the program bench_gemm in the build directory (built when nvcc is\n"
        "present). On a machine with an NVIDIA Hopper GPU:\n"
        "  python3 bench/peer_grouped_mm.py --out torch_peer.json      # torch._grouped_mm peer\n"
        "  <build>/bench_gemm --out bench_gemm.json --peer-json torch_peer.json\n"
        "  <build>/bench_wgmma_peak --out wgmma_peak.json               # tensor-core instruction ceiling\n"
        "or, from the repository root, bash bench/device_all.sh (builds, runs the GPU tests, compute-sanitizer,\n"
        "both peers and all Table-8 rows; writes $OUT/device_all.tgz, summary.txt and table.md).\n"
        "Results and their history: bench/NOTES.md, bench/results/*.json.\n");
  });
}

}  // namespace moesq::cli

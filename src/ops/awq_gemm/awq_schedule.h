// Tile schedules of the packed-AWQ MoE GEMM (DESIGN.md §6, paper 000 §2).
//
// Work is tiled as (MoE block p, N-tile n) with global tile index t = p·n_tiles + n,
// n_tiles = N / thread_n, k_tiles = K / thread_k. Two schedules:
//   native    — the one paper 000 derives for Marlin-style kernels: with grid G and T tiles, the first
//               (⌈T/G⌉ − 1)·G tiles run full-K in one CUDA block each ("direct"); the R = T − direct tiles
//               of the last wave are split along K into s equal slices, s the largest divisor of k_tiles
//               not above max(1, ⌊G/R⌋), and the slices are reduced in fp32 in a fixed slice order.
//               So the MoE block a route lands in selects its rounding trajectory.
//   invariant — every tile runs full-K in one slice, whatever G: a tile's arithmetic never depends on
//               its index, so outputs are invariant to membership, batch composition and grid.
//   invariant-split — every tile is split into the same s slices, s the largest divisor of k_tiles not
//               above kMaxInvariantSlices; s depends only on (K, thread_k), never on M, G or the tile
//               index, and the slices are reduced in fp32 in slice order. Invariant like `invariant`, but
//               at small M (decode steps: few tiles) it fills idle SMs as native's split remainder does.
// The one non-obvious decision: the schedule is a value (computed once, printed, recorded by audit
// runs as the "grid marker") that both the CPU `_ref` and the CUDA kernel consume, so the two cannot
// drift apart and the scorer can check the grid that was really applied.
#pragma once
#include <cstdint>
#include <string>


namespace moesq::ops {

enum class ScheduleKind { Native, Invariant, InvariantSplit };

// Upper bound on the fixed slice count of `invariant-split`: 8 is what native reaches at M = 1 on the
// H200 (96 tiles, grid 1188 → ⌊G/R⌋ = 12 → largest divisor of 32 K-tiles ≤ 12 = 8), so decode gets the
// same parallelism; larger s would only grow the fp32 workspace traffic at large M.
constexpr int kMaxInvariantSlices = 8;
// Slices of every tile under invariant-split: the largest divisor of k_tiles that is <= kMaxInvariantSlices.
int invariant_split_slices(int64_t k_tiles);
ScheduleKind parse_schedule_kind(const std::string& s);  // Error names --schedule
const char* schedule_kind_name(ScheduleKind k);

// Thread configuration of one CUDA block of the GEMM (Marlin's thread_k/thread_n/threads).
struct ThreadConfig {
  int thread_k = 0;       // K elements per K-tile
  int thread_n = 0;       // output columns per N-tile
  int threads = 0;        // threads per CUDA block
  int blocks_per_sm = 0;  // resident CUDA blocks per SM (occupancy)
  std::string str() const;  // "thread_k=64 thread_n=128 threads=128 blocks_per_sm=3"
};

// Overrides from the command line; 0 = "let the selector choose".
struct ThreadConfigOverrides {
  int thread_k = 0, thread_n = 0, threads = 0, blocks_per_sm = 0;
};

// Heuristic selector (the pinned choice of paper 000 for 8-row MoE blocks): the first candidate of
// {(64,128,128 threads), (128,64,128), (64,64,128)} whose tile sizes divide N and K; blocks_per_sm
// defaults to `default_blocks_per_sm` (the CUDA launcher passes the occupancy result; 3 on the
// paper's GPU). Overrides replace single fields; the result must divide N and K (Error naming the
// flag otherwise). MOESQ_PRINT_CONFIG=1 prints the chosen config to stderr.
ThreadConfig select_thread_config(int64_t N, int64_t K, const ThreadConfigOverrides& ov = {},
                                  int default_blocks_per_sm = 3);

struct TileSchedule {
  ScheduleKind kind = ScheduleKind::Native;
  int64_t num_blocks = 0;  // P, MoE blocks
  int64_t N = 0, K = 0;
  int thread_k = 0, thread_n = 0;
  int64_t grid = 0;           // G, CUDA blocks
  int64_t n_tiles = 0;        // N / thread_n
  int64_t k_tiles = 0;        // K / thread_k
  int64_t tiles = 0;          // T = P · n_tiles
  int64_t direct_tiles = 0;   // tiles [0, direct_tiles) run full-K (0 under invariant-split)
  int64_t split_tiles = 0;    // the R remaining tiles (all T under invariant-split)
  int slices = 1;             // s, slices of each remaining tile (1 = no reduction)
  int64_t first_split_block = -1;  // MoE block of tile `direct_tiles`; -1 when split_tiles == 0

  // Slices of tile t (1 for direct tiles); slice i covers K-tiles [i·k_tiles/s, (i+1)·k_tiles/s).
  int tile_slices(int64_t t) const { return t < direct_tiles ? 1 : slices; }
  std::string table() const;  // human-readable: which MoE blocks are direct, which split
};

TileSchedule make_schedule(ScheduleKind kind, int64_t num_blocks, int64_t N, int64_t K, int thread_k,
                           int thread_n, int64_t grid);

}  // namespace moesq::ops

// Tile schedules and the thread-config selector (see schedule.h). Non-obvious: a tile with one slice
// in the last wave is still counted in split_tiles (it is in the remainder), but runs the same
// arithmetic as a direct tile — that is why grid 200 collapses the two schedule classes.
#include "ops/awq_gemm/awq_schedule.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace moesq::ops {

ScheduleKind parse_schedule_kind(const std::string& s) {
  if (s == "native") return ScheduleKind::Native;
  if (s == "invariant") return ScheduleKind::Invariant;
  if (s == "invariant-split") return ScheduleKind::InvariantSplit;
  MOESQ_FAIL("--schedule: unknown schedule '", s, "' (expected native, invariant or invariant-split)");
}

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::Native: return "native";
    case ScheduleKind::Invariant: return "invariant";
    case ScheduleKind::InvariantSplit: return "invariant-split";
  }
  return "?";
}

int invariant_split_slices(int64_t k_tiles) {
  int s = 1;
  for (int d = 1; d <= kMaxInvariantSlices && d <= k_tiles; ++d)
    if (k_tiles % d == 0) s = d;
  return s;
}

std::string ThreadConfig::str() const {
  std::ostringstream os;
  os << "thread_k=" << thread_k << " thread_n=" << thread_n << " threads=" << threads
     << " blocks_per_sm=" << blocks_per_sm;
  return os.str();
}

ThreadConfig select_thread_config(int64_t N, int64_t K, const ThreadConfigOverrides& ov,
                                  int default_blocks_per_sm) {
  static const ThreadConfig kCandidates[] = {{64, 128, 128, 0}, {128, 64, 128, 0}, {64, 64, 128, 0}};
  ThreadConfig c{};
  bool found = false;
  for (const auto& cand : kCandidates) {
    const int tk = ov.thread_k ? ov.thread_k : cand.thread_k;
    const int tn = ov.thread_n ? ov.thread_n : cand.thread_n;
    if (tk > 0 && tn > 0 && K % tk == 0 && N % tn == 0) {
      c = {tk, tn, ov.threads ? ov.threads : cand.threads, 0};
      found = true;
      break;
    }
  }
  MOESQ_CHECK(found, "select_thread_config: no thread config divides N=", N, " K=", K,
              (ov.thread_k ? " (--thread-k " + std::to_string(ov.thread_k) + ")" : std::string()),
              (ov.thread_n ? " (--thread-n " + std::to_string(ov.thread_n) + ")" : std::string()));
  c.blocks_per_sm = ov.blocks_per_sm ? ov.blocks_per_sm : default_blocks_per_sm;
  if (const char* p = std::getenv("MOESQ_PRINT_CONFIG"); p && std::string(p) == "1")
    std::fprintf(stderr, "moesq: awq gemm N=%lld K=%lld %s\n", static_cast<long long>(N),
                 static_cast<long long>(K), c.str().c_str());
  return c;
}

TileSchedule make_schedule(ScheduleKind kind, int64_t num_blocks, int64_t N, int64_t K, int thread_k,
                           int thread_n, int64_t grid) {
  MOESQ_CHECK(thread_k > 0 && K % thread_k == 0, "schedule: --thread-k ", thread_k, " does not divide K=", K);
  MOESQ_CHECK(thread_n > 0 && N % thread_n == 0, "schedule: --thread-n ", thread_n, " does not divide N=", N);
  MOESQ_CHECK(grid > 0, "schedule: --grid must be positive, got ", grid);
  MOESQ_CHECK(num_blocks >= 0, "schedule: --blocks must be >= 0, got ", num_blocks);
  TileSchedule s;
  s.kind = kind;
  s.num_blocks = num_blocks;
  s.N = N;
  s.K = K;
  s.thread_k = thread_k;
  s.thread_n = thread_n;
  s.grid = grid;
  s.n_tiles = N / thread_n;
  s.k_tiles = K / thread_k;
  s.tiles = num_blocks * s.n_tiles;
  if (kind == ScheduleKind::InvariantSplit) {
    // Every tile is a "remainder" tile with the same slice count: the kernel and the `_ref` then run
    // the identical per-tile arithmetic whatever the tile index, M or G.
    s.split_tiles = s.tiles;
    s.slices = invariant_split_slices(s.k_tiles);
    s.first_split_block = s.tiles > 0 ? 0 : -1;
    return s;
  }
  if (kind == ScheduleKind::Invariant || s.tiles == 0) {
    s.direct_tiles = s.tiles;
    return s;
  }
  const int64_t waves = (s.tiles + grid - 1) / grid;
  s.direct_tiles = (waves - 1) * grid;
  s.split_tiles = s.tiles - s.direct_tiles;
  const int64_t cap = std::max<int64_t>(1, grid / s.split_tiles);
  for (int64_t d = 1; d <= std::min(cap, s.k_tiles); ++d)
    if (s.k_tiles % d == 0) s.slices = static_cast<int>(d);
  s.first_split_block = s.direct_tiles / s.n_tiles;
  return s;
}


std::string TileSchedule::table() const {
  std::ostringstream os;
  os << "schedule " << schedule_kind_name(kind) << ": " << num_blocks << " MoE blocks x " << n_tiles
     << " N-tiles = " << tiles << " tiles, " << k_tiles << " K-tiles each, grid " << grid << "\n";
  os << "  direct (full-K, one CUDA block): tiles [0, " << direct_tiles << ")";
  if (direct_tiles > 0) os << " = MoE blocks 0.." << (direct_tiles - 1) / n_tiles;
  os << "\n";
  if (kind == ScheduleKind::InvariantSplit) {
    os << "  every tile: " << slices << " slice(s) of " << k_tiles / slices << " K-tiles (fixed by K and thread_k, <= "
       << kMaxInvariantSlices << ")" << (slices > 1 ? ", fp32 reduction in slice order" : ", no reduction") << "\n";
    return os.str();
  }
  if (split_tiles > 0) {
    os << "  remainder: tiles [" << direct_tiles << ", " << tiles << ") from MoE block " << first_split_block
       << ", " << slices << " slice(s) of " << k_tiles / slices << " K-tiles"
       << (slices > 1 ? ", fp32 reduction in slice order" : ", no reduction") << "\n";
    if (direct_tiles % n_tiles != 0)
      os << "  MoE block " << first_split_block << " is mixed: N-tiles 0.." << direct_tiles % n_tiles - 1
         << " direct, the rest in the remainder\n";
  }
  return os.str();
}

}  // namespace moesq::ops

// Expert → rank partition of one MoE layer (docs/PARALLEL.md): a pure function of the expert id and
// the number of ranks, the same on every rank and for every layer, so no rank ever asks another who
// owns what. Round-robin (`expert % num_ranks`) rather than contiguous blocks: neighbouring expert
// ids are not correlated with load, and round-robin keeps every rank's share within one expert of
// the others whatever E and N are (N > E leaves the ranks r >= E without experts: they still take
// part in every collective, contributing nothing).
#pragma once
#include <cstdint>
#include <vector>

namespace moesq::dist {

// The rank that compresses `expert` (in [0, num_ranks)). Error for num_ranks < 1 or expert < 0.
int expert_owner(int64_t expert, int num_ranks);

// The experts of a layer of `num_experts` owned by `rank`, ascending. Error for a rank outside
// [0, num_ranks).
std::vector<int64_t> experts_of_rank(int64_t num_experts, int rank, int num_ranks);

// The ENGINE's expert shard (expert parallelism at inference, docs/PARALLEL.md "The expert-parallel
// engine"): rank r holds the CONTIGUOUS experts [E·r/N, E·(r+1)/N) of every MoE layer. Contiguous,
// not round-robin as compression's: a rank's experts are then one slice of the layer's weights and one
// expert range of the grouped GEMMs. Shares are within one expert of each other; N > E leaves empty
// ranges. Errors as experts_of_rank.
struct ExpertRange {
  int64_t begin = 0, end = 0;  // [begin, end)
  int64_t size() const { return end - begin; }
  bool contains(int64_t e) const { return e >= begin && e < end; }
};
ExpertRange engine_expert_range(int64_t num_experts, int rank, int num_ranks);

}  // namespace moesq::dist

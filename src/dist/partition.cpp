#include "dist/partition.h"

#include "core/error.h"

namespace moesq::dist {

int expert_owner(int64_t expert, int num_ranks) {
  MOESQ_CHECK(num_ranks >= 1, "expert partition: num_ranks=", num_ranks, " must be >= 1");
  MOESQ_CHECK(expert >= 0, "expert partition: expert id ", expert, " must be >= 0");
  return static_cast<int>(expert % num_ranks);
}

std::vector<int64_t> experts_of_rank(int64_t num_experts, int rank, int num_ranks) {
  MOESQ_CHECK(num_ranks >= 1 && rank >= 0 && rank < num_ranks, "expert partition: rank ", rank,
              " outside [0, ", num_ranks, ")");
  std::vector<int64_t> mine;
  for (int64_t e = rank; e < num_experts; e += num_ranks) mine.push_back(e);
  return mine;
}

ExpertRange engine_expert_range(int64_t num_experts, int rank, int num_ranks) {
  MOESQ_CHECK(num_ranks >= 1 && rank >= 0 && rank < num_ranks, "expert shard: rank ", rank, " outside [0, ",
              num_ranks, ")");
  MOESQ_CHECK(num_experts >= 0, "expert shard: num_experts=", num_experts, " must be >= 0");
  return {num_experts * rank / num_ranks, num_experts * (rank + 1) / num_ranks};
}

}  // namespace moesq::dist

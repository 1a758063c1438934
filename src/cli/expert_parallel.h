// `mpirun -np N moesq eval|bench e2e … --device cuda`: with N > 1 ranks the GPU engine runs expert-
// parallel (docs/PARALLEL.md "The expert-parallel engine"): each rank takes a GPU (its host-local rank
// mod the visible GPUs, as compression's ranks do), holds its contiguous shard of every MoE layer's
// routed experts (dist::engine_expert_range) and everything else whole, and the ranks sum their
// route-major expert outputs through MPI (dist::allreduce_sum_u32, staged through host memory: the
// engine then decodes without CUDA graphs). Every rank runs the same command; rank 0 prints. A plain
// process (no launcher) is one rank and changes nothing.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dist/communicator.h"
#include "runtime/engine.h"

namespace moesq::cli {

// The GPU a rank of `comm` takes (dist::gpu_for_local_rank of its host-local rank) and how many are
// visible; what `compress` and the expert-parallel engine bind. Error (naming `what`) when no GPU is
// visible or the build has no CUDA.
struct RankGpu {
  int gpu = 0, visible = 0;
};
RankGpu gpu_of_rank(const dist::Communicator& comm, const std::string& what);

class ExpertParallel {
 public:
  // The ranks of this run (MPI when launched by mpirun, else one process). `what` names the command.
  explicit ExpertParallel(const std::string& what);
  int ranks() const { return comm_ ? comm_->size() : 1; }
  bool root() const { return !comm_ || comm_->rank() == 0; }
  // For N > 1: binds this rank's GPU and sets eo's expert shard and exchange for a model of
  // num_experts routed experts. N = 1: nothing.
  void apply(int64_t num_experts, runtime::EngineOptions& eo) const;
  // The shard apply() sets, as "[begin, end) of E" (for logs).
  std::string shard(int64_t num_experts) const;
  // Runs fn; with N > 1 an error on any rank ends every rank with its message (dist::run_or_abort_all).
  void run(const std::function<void()>& fn) const;

 private:
  std::unique_ptr<dist::Communicator> comm_;
  std::string what_;
};

}  // namespace moesq::cli

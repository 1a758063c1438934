// `mpirun -np N moesq eval|bench e2e … --device cuda`: with N > 1 ranks the GPU engine runs expert-
// parallel (docs/PARALLEL.md "The expert-parallel engine"): each rank takes a GPU (its host-local rank
// mod the visible GPUs, as compression's ranks do), holds its contiguous shard of every MoE layer's
// routed experts (dist::engine_expert_range) and everything else whole, and the ranks sum their
// route-major expert outputs (uint32 words) by one of two exchanges:
//  - nccl: GPU to GPU (dist::DeviceCollectives), captured in the decode graphs; needs one GPU per rank;
//  - host: staged through host memory and MPI (dist::allreduce_sum_u32); the engine then decodes
//    without CUDA graphs; works when ranks share a GPU (NCCL refuses that).
// auto (the default) takes nccl when the build has NCCL and every rank of each host has a GPU of its
// own, else host. Every rank runs the same command; rank 0 prints. A plain process (no launcher) is one
// rank and changes nothing.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dist/communicator.h"
#include "runtime/engine.h"

namespace CLI {
class App;
}
namespace moesq::dist {
class DeviceCollectives;
}

namespace moesq::cli {

// The GPU a rank of `comm` takes (dist::gpu_for_local_rank of its host-local rank) and how many are
// visible; what `compress` and the expert-parallel engine bind. Error (naming `what`) when no GPU is
// visible or the build has no CUDA.
struct RankGpu {
  int gpu = 0, visible = 0;
};
RankGpu gpu_of_rank(const dist::Communicator& comm, const std::string& what);

// --expert-exchange auto|nccl|host (the exchange of ExpertParallel, above) on `cmd`.
void add_expert_exchange_flag(CLI::App* cmd, std::string& exchange);

class ExpertParallel {
 public:
  // The ranks of this run (MPI when launched by mpirun, else one process). `what` names the command;
  // exchange is "auto" | "nccl" | "host" (the --expert-exchange flag; Error naming it otherwise).
  explicit ExpertParallel(const std::string& what, const std::string& exchange = "auto");
  ~ExpertParallel();
  int ranks() const { return comm_ ? comm_->size() : 1; }
  bool root() const { return !comm_ || comm_->rank() == 0; }
  // For N > 1: binds this rank's GPU and sets eo's expert shard and exchange for a model of
  // num_experts routed experts (the NCCL communicator is made at the first call, collectively, and
  // kept for the later ones). N = 1: nothing.
  void apply(int64_t num_experts, runtime::EngineOptions& eo) const;
  // "nccl" or "host": the exchange apply() sets (decided at construction).
  const std::string& exchange() const { return exchange_; }
  // The shard apply() sets, as "[begin, end) of E" (for logs).
  std::string shard(int64_t num_experts) const;
  // Runs fn; with N > 1 an error on any rank ends every rank with its message (dist::run_or_abort_all).
  void run(const std::function<void()>& fn) const;

 private:
  std::unique_ptr<dist::Communicator> comm_;
  std::string what_, exchange_ = "host";
  // shared_ptr: its deleter is made where create() is called (CUDA builds only), so a build without
  // CUDA (no dist/device_collectives.cu) never needs the destructor.
  mutable std::shared_ptr<dist::DeviceCollectives> nccl_;
};

}  // namespace moesq::cli

#include "cli/expert_parallel.h"

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/progress.h"
#include "dist/device_collectives.h"
#include "dist/gpu_binding.h"
#include "dist/partition.h"

#ifdef MOESQ_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace moesq::cli {

RankGpu gpu_of_rank(const dist::Communicator& comm, const std::string& what) {
#ifdef MOESQ_HAVE_CUDA
  RankGpu r;
  MOESQ_CHECK(cudaGetDeviceCount(&r.visible) == cudaSuccess && r.visible > 0, what, ": no visible GPU");
  r.gpu = dist::gpu_for_local_rank(comm.local_rank(), comm.local_size(), r.visible);
  return r;
#else
  (void)comm;
  MOESQ_FAIL(what, ": this moesq was built without CUDA");
#endif
}

void add_expert_exchange_flag(CLI::App* cmd, std::string& exchange) {
  cmd->add_option("--expert-exchange", exchange,
                  "under mpirun -np N (N > 1), how the expert-parallel ranks sum their experts' outputs: nccl (GPU to "
                  "GPU, decode stays in CUDA graphs; one GPU per rank), host (through host memory and MPI; ranks may "
                  "share a GPU; decode runs without graphs), auto (nccl when built with NCCL and every rank has a GPU "
                  "of its own, else host)")
      ->check(CLI::IsMember({"auto", "nccl", "host"}))
      ->capture_default_str();
}

ExpertParallel::ExpertParallel(const std::string& what, const std::string& exchange) : what_(what) {
  MOESQ_CHECK(exchange == "auto" || exchange == "nccl" || exchange == "host", what, ": --expert-exchange '", exchange,
              "' is not one of auto, nccl, host");
  if (dist::launched_by_mpi()) comm_ = dist::communicator_from_environment();
  if (!root()) set_progress_enabled(false);  // rank 0 speaks for the run
  if (ranks() == 1) return;
#ifdef MOESQ_HAVE_CUDA
  if (exchange == "host") return;
  if (exchange == "nccl") {
    MOESQ_CHECK(dist::nccl_built(), what, ": --expert-exchange nccl: this moesq was built without NCCL");
    exchange_ = "nccl";
    return;
  }
  // auto: NCCL where every rank of every host has a GPU of its own (NCCL refuses two ranks on one GPU).
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
  const std::string own = comm_->local_size() <= visible ? "1" : "0";
  bool everywhere = true;
  for (const std::string& o : comm_->allgather(own)) everywhere = everywhere && o == "1";
  if (everywhere && dist::nccl_built()) exchange_ = "nccl";
#else
  (void)exchange;
#endif
}

ExpertParallel::~ExpertParallel() = default;

void ExpertParallel::apply(int64_t num_experts, runtime::EngineOptions& eo) const {
  if (ranks() == 1) return;
  MOESQ_CHECK(num_experts >= ranks(), what_, ": ", ranks(), " ranks for a model of ", num_experts,
              " routed experts (expert parallelism gives each rank at least one expert)");
#ifdef MOESQ_HAVE_CUDA
  const int gpu = gpu_of_rank(*comm_, what_ + " --device cuda").gpu;
  MOESQ_CHECK(cudaSetDevice(gpu) == cudaSuccess, what_, ": cannot select GPU ", gpu);
  const dist::ExpertRange mine = dist::engine_expert_range(num_experts, comm_->rank(), ranks());
  eo.expert_begin = mine.begin, eo.expert_end = mine.end;
  if (exchange_ == "nccl") {
    if (!nccl_) nccl_ = dist::DeviceCollectives::create(*comm_, gpu);
    dist::DeviceCollectives* nccl = nccl_.get();
    eo.exchange.capturable = true;
    eo.exchange.all_reduce_sum = [nccl](uint32_t* words, int64_t count, cudaStream_t stream) {
      nccl->allreduce_sum_u32(words, count, stream);
    };
    return;
  }
  dist::Communicator* comm = comm_.get();
  eo.exchange = runtime::host_staged_exchange(
      [comm](uint32_t* words, int64_t count) { dist::allreduce_sum_u32(*comm, words, count); });
#else
  (void)eo;
  MOESQ_FAIL(what_, ": the expert-parallel GPU engine needs a moesq built with CUDA");
#endif
}

std::string ExpertParallel::shard(int64_t num_experts) const {
  if (ranks() == 1) return "all " + std::to_string(num_experts) + " experts";
  const dist::ExpertRange m = dist::engine_expert_range(num_experts, comm_->rank(), ranks());
  return "experts [" + std::to_string(m.begin) + ", " + std::to_string(m.end) + ") of " + std::to_string(num_experts);
}

void ExpertParallel::run(const std::function<void()>& fn) const {
  if (ranks() == 1) return fn();
  dist::run_or_abort_all(*comm_, fn);
}

}  // namespace moesq::cli

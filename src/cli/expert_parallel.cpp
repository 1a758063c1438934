#include "cli/expert_parallel.h"

#include "core/error.h"
#include "core/progress.h"
#include "dist/gpu_binding.h"
#include "dist/partition.h"

#ifdef MOESQ_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace moesq::cli {

ExpertParallel::ExpertParallel(const std::string& what) : what_(what) {
  if (dist::launched_by_mpi()) comm_ = dist::communicator_from_environment();
  if (!root()) set_progress_enabled(false);  // rank 0 speaks for the run
}

void ExpertParallel::apply(int64_t num_experts, runtime::EngineOptions& eo) const {
  if (ranks() == 1) return;
  MOESQ_CHECK(num_experts >= ranks(), what_, ": ", ranks(), " ranks for a model of ", num_experts,
              " routed experts (expert parallelism gives each rank at least one expert)");
#ifdef MOESQ_HAVE_CUDA
  int n = 0;
  MOESQ_CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n > 0, what_, " --device cuda: no visible GPU");
  const int gpu = dist::gpu_for_local_rank(comm_->local_rank(), comm_->local_size(), n);
  MOESQ_CHECK(cudaSetDevice(gpu) == cudaSuccess, what_, ": cannot select GPU ", gpu);
  const dist::ExpertRange mine = dist::engine_expert_range(num_experts, comm_->rank(), ranks());
  eo.expert_begin = mine.begin, eo.expert_end = mine.end;
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

#include "cli/expert_parallel.h"

#include "core/error.h"
#include "core/progress.h"
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

ExpertParallel::ExpertParallel(const std::string& what) : what_(what) {
  if (dist::launched_by_mpi()) comm_ = dist::communicator_from_environment();
  if (!root()) set_progress_enabled(false);  // rank 0 speaks for the run
}

void ExpertParallel::apply(int64_t num_experts, runtime::EngineOptions& eo) const {
  if (ranks() == 1) return;
  MOESQ_CHECK(num_experts >= ranks(), what_, ": ", ranks(), " ranks for a model of ", num_experts,
              " routed experts (expert parallelism gives each rank at least one expert)");
#ifdef MOESQ_HAVE_CUDA
  const int gpu = gpu_of_rank(*comm_, what_ + " --device cuda").gpu;
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

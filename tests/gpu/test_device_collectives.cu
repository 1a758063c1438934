// GPU tests of dist::DeviceCollectives (the NCCL exchange of the expert-parallel engine) on the one GPU a
// single-GPU machine has: NCCL refuses two ranks on one GPU, so these run ONE rank (the local
// communicator) and check what that can show — the communicator bootstraps through broadcast(), the
// all-reduce of uint32 words leaves every bit as it was (an integer sum over one rank; NaN payloads and
// −0 patterns included), count 0 is a no-op, and the call captured in a CUDA graph and replayed twice
// does the same as the eager call (what the engine's decode graphs need). Several ranks wait for a
// multi-GPU machine (issue 30).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "dist/communicator.h"
#include "dist/device_collectives.h"
#include "support/gpu_test_main.h"

using moesq::DevBuf;

namespace {

std::vector<uint32_t> random_words(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<uint32_t> w(n);
  for (auto& x : w) x = static_cast<uint32_t>(g());
  w[0] = 0x80008000u;  // two bf16 −0
  w[1] = 0x7fc17fa5u;  // two bf16 NaN payloads
  return w;
}

std::vector<uint32_t> download(const DevBuf<uint32_t>& d, size_t n) {
  std::vector<uint32_t> h(n);
  MOESQ_CUDA_CHECK(cudaMemcpy(h.data(), d.p, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  return h;
}

TEST(DeviceCollectives, OneRankAllReduceKeepsEveryBitEagerAndInAGraph) {
  if (!moesq::dist::nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  auto comm = moesq::dist::local_communicator();
  auto nccl = moesq::dist::DeviceCollectives::create(*comm, 0);
  EXPECT_EQ(nccl->rank(), 0);
  EXPECT_EQ(nccl->size(), 1);
  cudaStream_t stream;
  MOESQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t n = 1 << 18;  // 1 MiB: a Kimi decode step's exchange at B = 8
  DevBuf<uint32_t> d;
  d.alloc(n);

  const std::vector<uint32_t> a = random_words(n, 1);
  MOESQ_CUDA_CHECK(cudaMemcpy(d.p, a.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice));
  nccl->allreduce_sum_u32(d.p, static_cast<int64_t>(n), stream);
  nccl->allreduce_sum_u32(d.p, 0, stream);  // nothing to move
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_EQ(download(d, n), a);

  // Captured once, replayed over two different inputs.
  cudaGraph_t graph;
  MOESQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  nccl->allreduce_sum_u32(d.p, static_cast<int64_t>(n), stream);
  MOESQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  MOESQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (uint64_t seed : {2, 3}) {
    const std::vector<uint32_t> b = random_words(n, seed);
    MOESQ_CUDA_CHECK(cudaMemcpy(d.p, b.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice));
    MOESQ_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(download(d, n), b) << "replay with seed " << seed;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(DeviceCollectives, ANegativeCountIsAnError) {
  if (!moesq::dist::nccl_built()) GTEST_SKIP() << "this build has no NCCL";
  auto comm = moesq::dist::local_communicator();
  auto nccl = moesq::dist::DeviceCollectives::create(*comm, 0);
  EXPECT_THROW(nccl->allreduce_sum_u32(nullptr, -1, nullptr), moesq::Error);
}

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }

// CPU tests of the GPU engine's MLA block (runtime/layers/mla_block.h) through its twin, mla_block_ref:
// the ops' twins in the GPU's order on the host layout load_host_mla produces must compute the CPU
// model's multi-head latent attention (model::MlaMixer, the mixer the transformers parity tests check)
// on the DeepSeek-V3 fixture, and give a token the same bits in a prompt, a decode step or any cut of
// the two, contiguous or paged (the determinism contract of ops/mla/mla.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "io/checkpoint.h"
#include "model/mixers/mla_mixer.h"
#include "model/tensor_math.h"
#include "ops/mla/mla.h"
#include "runtime/layers/mla_block.h"
#include "runtime/weights.h"

using namespace moesq;

namespace {

std::string fixture(const char* name) { return std::string(MOESQ_FIXTURES) + "/families/" + name; }

std::vector<float> random_rows(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

}  // namespace

// The twin of the GPU block equals the model's mixer (naive form, fp32 cache) on both MLA layers the
// fixture's dense and MoE layers carry, over two 64-key chunks. What differs: the latent cache and
// the GEMM inputs are bf16 (hi + lo pairs for activations: ≈ 2^-17), the cache alone bf16 (2^-9
// relative per value); the measured max error is ≈ 2e-3 of the output's scale.
TEST(MlaBlockRef, ComputesTheModelsMlaMixer) {
  constexpr double kRelTol = 1e-2;
  const io::Checkpoint ck(fixture("tiny-deepseek-v3"));
  const io::ModelSpec& s = ck.spec();
  ASSERT_TRUE(runtime::mla_block_refusal(s).empty()) << runtime::mla_block_refusal(s);
  const runtime::MlaBlockDims d = runtime::mla_block_dims(s);
  constexpr int64_t T = 70, max_len = 128;
  std::vector<float> cos, sin;
  runtime::mla_rope_tables(s, max_len, cos, sin);
  for (int64_t layer : {int64_t{0}, s.num_layers - 1}) {
    const runtime::HostMla w = runtime::load_host_mla(ck, layer);
    const auto mixer = model::load_mla_mixer(ck, layer);
    const std::vector<float> h0 = random_rows(T * d.H, 17 + layer);
    std::vector<float> x(T * d.H);
    model::rmsnorm_rows(h0.data(), T, d.H, w.input_norm.data(), s.rms_norm_eps, x.data());
    const std::vector<float> want = mixer->forward(x.data(), T, model::ForwardOptions{});
    std::vector<uint16_t> cache(max_len * d.latent_row());
    ops::MlaCacheArgs kv;
    kv.cache = cache.data(), kv.max_len = max_len;
    std::vector<int32_t> slot(T, 0), pos(T);
    std::iota(pos.begin(), pos.end(), 0);
    std::vector<float> h = h0;
    runtime::mla_block_ref(d, w, cos.data(), sin.data(), kv, slot.data(), pos.data(), T, h.data());
    double err = 0, scale = 0;
    for (int64_t i = 0; i < T * d.H; ++i) {
      err = std::max(err, std::fabs(static_cast<double>(h[i] - h0[i]) - want[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    }
    ASSERT_GT(scale, 0.0);
    EXPECT_LT(err / scale, kRelTol) << "layer " << layer << ": max error " << err << " of scale " << scale;
  }
}

// A token's bits do not depend on how its sequence is cut into calls (one prompt; token by token;
// uneven chunks) nor on which physical KV blocks hold it, nor on another sequence in the same call.
TEST(MlaBlockRef, PromptDecodeAndPagingGiveTheSameBits) {
  const io::Checkpoint ck(fixture("tiny-deepseek-v3"));
  const io::ModelSpec& s = ck.spec();
  const runtime::MlaBlockDims d = runtime::mla_block_dims(s);
  const runtime::HostMla w = runtime::load_host_mla(ck, 1);
  constexpr int64_t T = 150, max_len = 192;  // three chunks
  std::vector<float> cos, sin;
  runtime::mla_rope_tables(s, max_len, cos, sin);
  const std::vector<float> h0 = random_rows(T * d.H, 5);
  const int64_t D = d.latent_row(), bps = ops::kv_blocks_per_slot(max_len);

  // cuts: pieces of the sequence given per call; paged: slot 1 of a two-slot paged cache with a
  // scrambled table, slot 0 filled alongside with other rows.
  auto run = [&](const std::vector<int64_t>& cuts, bool paged) {
    std::vector<uint16_t> cache((paged ? 2 * bps * ops::kKvBlockTokens : max_len) * D);
    std::vector<int32_t> table;
    ops::MlaCacheArgs kv;
    kv.cache = cache.data(), kv.max_len = max_len;
    if (paged) {
      table.resize(2 * bps);
      for (int64_t b = 0; b < bps; ++b) table[b] = static_cast<int32_t>(2 * b), table[bps + b] = static_cast<int32_t>(2 * (bps - 1 - b) + 1);
      kv.block_table = table.data(), kv.kv_blocks = 2 * bps;
    }
    const int32_t me = paged ? 1 : 0;
    std::vector<float> out;
    int64_t p0 = 0;
    for (int64_t n : cuts) {
      std::vector<float> h(h0.begin() + p0 * d.H, h0.begin() + (p0 + n) * d.H);
      std::vector<int32_t> slot(n, me), pos(n);
      for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(p0 + i);
      if (paged) {  // another sequence in the same call, before this one
        const std::vector<float> other = random_rows(n * d.H, 99 + p0);
        h.insert(h.begin(), other.begin(), other.end());
        slot.insert(slot.begin(), n, 0);
        const std::vector<int32_t> mine = pos;
        pos.insert(pos.begin(), mine.begin(), mine.end());
      }
      runtime::mla_block_ref(d, w, cos.data(), sin.data(), kv, slot.data(), pos.data(),
                             static_cast<int64_t>(slot.size()), h.data());
      out.insert(out.end(), h.end() - n * d.H, h.end());
      p0 += n;
    }
    return out;
  };
  const std::vector<float> whole = run({T}, false);
  std::vector<int64_t> ones(T, 1), uneven = {7, 64, 1, 50, 28};
  for (const auto& [cuts, paged] : {std::pair{ones, false}, {uneven, false}, {std::vector<int64_t>{T}, true},
                                    {uneven, true}}) {
    const std::vector<float> got = run(cuts, paged);
    ASSERT_EQ(got.size(), whole.size());
    int64_t diff = 0;
    for (size_t i = 0; i < got.size(); ++i) diff += got[i] != whole[i];
    EXPECT_EQ(diff, 0) << cuts.size() << " calls, paged " << paged;
  }
}

TEST(MlaBlockRef, RefusesWhatTheKernelsAreNotBuiltFor) {
  io::ModelSpec s = io::Checkpoint(fixture("tiny-deepseek-v3")).spec();
  EXPECT_TRUE(runtime::mla_block_refusal(s).empty());
  EXPECT_TRUE(runtime::supports(s)) << runtime::gpu_refusal(s);
  io::ModelSpec bad = s;
  bad.mla.kv_lora_rank = 48;
  EXPECT_NE(runtime::mla_block_refusal(bad).find("kv_lora_rank 48"), std::string::npos) << runtime::mla_block_refusal(bad);
  bad = s;
  bad.mla.qk_rope_head_dim = 128;
  EXPECT_NE(runtime::mla_block_refusal(bad).find("qk_rope_head_dim 128"), std::string::npos);
  bad = s;
  bad.attention_bias = true;
  EXPECT_NE(runtime::gpu_refusal(bad).find("attention block: its MLA projections have biases"), std::string::npos)
      << runtime::gpu_refusal(bad);
  bad = s;
  bad.mla = io::MlaSpec{};
  EXPECT_NE(runtime::mla_block_refusal(bad).find("not multi-head latent attention"), std::string::npos);
}

// End-to-end GPU engine tests on the tiny Qwen3-MoE fixture (models/tiny-qwen3-moe): per-window
// nats vs the CPU forward (within the rounding floors below: 2e-2 W16A16, 5e-2 W4A4), decode (CUDA graph)
// vs prefill logits, and the deterministic-mode guarantee: one sequence's logits BITWISE equal alone
// and inside batches of 8 and 64 other sequences of other lengths, in prefill and decode; decode over
// any set of slots (a graph per batch size, replayed with other slot lists) BITWISE equal to each
// sequence alone in slot 0; the Generator over the engine equals the plain prefill/decode loop.
// The compressed checkpoint comes from MOESQ_TINY_COMPRESSED (made by `moesq compress … --method
// sgptq` in the device script); without it those tests fail loudly, never pass silently.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "model/tensor_math.h"
#include "model/decoder.h"
#include "runtime/engine.h"
#include "runtime/engine_backend.h"
#include "runtime/generator.h"
#include "runtime/kv_blocks.h"
#include "support/gpu_test_main.h"
#include "support/text_tokens.h"

using namespace moesq;

namespace {

// Per-window nats vs the fp32 CPU forward. The issue asked 2e-3 (bf16) and 5e-3 (W4A4); neither is
// reachable with the bf16 KV cache the issue prescribes, on this fixture: bench/e2e_rounding_floor
// (CPU forward in fp64, ONE rounding applied; bench/results/e2e_rounding_floor_v4.txt) moves a window
// by up to 9.8e-3 nats from rounding K/V to bf16 alone (W16A16), and under W4A4 by 3.0e-2 from K/V alone
// and 1.4e-2 from the summation order alone (fp64 loops vs fp32 OpenBLAS, no rounding at all): the
// NVFP4 activation quantizer turns ulp-level input changes into whole E2M1 steps. The bounds below are
// about 2× those floors; the engine's own roundings were cut where they dominated (fp32 quantizer
// inputs, fp32 gate|up, NOTES e2e v4).
constexpr double kBf16NatsTol = 2e-2;        // W16A16: floor 9.8e-3 (bf16 K/V alone)
constexpr double kW4A4NatsTol = 5e-2;        // W4A4: floors 3.0e-2 (bf16 K/V), 1.4e-2 (summation order)
// W4A16 / bf16 experts of the compressed checkpoint: the same W16A16 arithmetic as kBf16NatsTol, so the
// same floor (9.8e-3 from bf16 K/V alone). The issue asked 5e-3, below that floor: it held on the
// CPU-made checkpoint below, and failed on the GPU-made one the device script makes since `compress`
// defaults to the GPU (9.09e-3 on window 1 with bf16 experts, session 15 call 6: within the floor).
constexpr double kCompressedNatsTol = kBf16NatsTol;
// The compressed bounds hold for MOESQ_TINY_COMPRESSED = `moesq compress models/tiny-qwen3-moe --method
// sgptq --calib-samples 32` (the checkpoint they were measured on). A weaker one is more sensitive:
// with --calib-samples 16 --seq-len 128 (held-out nats 3.74 vs 2.95 on window 0) the W4A4 windows moved
// up to 0.105 and the W4A16 ones 0.015 (device run 2026-12-01), the same engine passing on the 32-sample one.
constexpr double kDecodeLogitTol = 1e-4;     // decode vs prefill logits (expected bitwise, see below)

std::string tiny() { return MOESQ_DEFAULT_MODEL; }
std::string compressed() {
  const char* p = std::getenv("MOESQ_TINY_COMPRESSED");
  return p ? p : "";
}

using moesq::test::text_tokens;

// As DecoderModel::window_nll: the mean next-token nll of logits [T, V].
double nll(const float* logits, int64_t V, const std::vector<int32_t>& tokens) {
  return model::next_token_nll(logits, tokens, V);
}

// Per-window nats of the engine (all windows in ONE batched prefill) vs the CPU forward.
void check_eval(const std::string& dir, runtime::ExpertBackend backend, bool cpu_act_quant, double tol) {
  const io::Checkpoint ckpt(dir);
  const model::DecoderModel cpu(ckpt);
  model::ForwardOptions fo = cpu.default_forward_options();
  fo.act_quant = cpu_act_quant;
  if (cpu_act_quant && fo.act_block == 0) fo.act_block = 32;
  runtime::EngineOptions opt;
  opt.experts = backend, opt.max_seqs = 4, opt.max_len = 160;
  runtime::Engine eng(ckpt, opt);
  std::vector<runtime::SeqChunk> chunks;
  std::vector<std::vector<int32_t>> windows;
  for (int w = 0; w < 4; ++w) {
    windows.push_back(text_tokens(100 + 20 * w, 40 + w));
    chunks.push_back({w, windows.back()});
  }
  eng.set_timing(true);
  const std::vector<float> z = eng.forward(chunks, true);
  const int64_t V = eng.spec().vocab_size;
  int64_t row = 0;
  for (int w = 0; w < 4; ++w) {
    int64_t pred = 0;
    const double c = cpu.window_nll(windows[w], fo, &pred);
    const double g = nll(z.data() + row * V, V, windows[w]);
    row += windows[w].size();
    std::printf("[engine] %s %s window %d: cpu %.6f gpu %.6f diff %.2e nats\n", dir.c_str(),
                runtime::expert_backend_name(eng.backend()), w, c, g, g - c);
    EXPECT_LE(std::fabs(g - c), tol) << dir << " backend " << runtime::expert_backend_name(eng.backend()) << " window " << w;
  }
  std::printf("[engine] attention %.3f ms, MoE %.3f ms of the prefill\n", eng.last_attention_ms(), eng.last_moe_ms());
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Logits of slot 0's sequence `seq` (prefill, then `steps` decode tokens) while slots 1..B-1 hold
// other random sequences of other lengths. Returns [1 + steps, V].
std::vector<float> run_in_batch(runtime::Engine& eng, const std::vector<int32_t>& seq, const std::vector<int32_t>& next,
                                int B, uint64_t seed) {
  eng.reset();
  std::mt19937_64 g(seed);
  std::vector<runtime::SeqChunk> chunks = {{0, seq}};
  for (int b = 1; b < B; ++b) chunks.push_back({b, text_tokens(3 + g() % 60, seed * 100 + b)});
  std::vector<float> z = eng.forward(chunks, false);
  const int64_t V = eng.spec().vocab_size;
  std::vector<float> out(z.begin(), z.begin() + V);
  for (int32_t tok : next) {
    std::vector<int32_t> toks(B);
    for (int b = 0; b < B; ++b) toks[b] = b == 0 ? tok : static_cast<int32_t>(g() % V);
    z = eng.decode(toks);
    out.insert(out.end(), z.begin(), z.begin() + V);
  }
  return out;
}

void check_batch_invariance(const std::string& dir, runtime::ExpertBackend backend) {
  const io::Checkpoint ckpt(dir);
  runtime::EngineOptions opt;
  opt.experts = backend, opt.max_seqs = 64, opt.max_len = 96, opt.max_tokens = 64 * 64;
  runtime::Engine eng(ckpt, opt);
  const std::vector<int32_t> seq = text_tokens(41, 7), next = text_tokens(32, 8);
  const std::vector<float> alone = run_in_batch(eng, seq, next, 1, 1);
  for (int B : {8, 64}) {
    const std::vector<float> in_batch = run_in_batch(eng, seq, next, B, 2 + B);
    ASSERT_EQ(in_batch.size(), alone.size());
    const int64_t V = eng.spec().vocab_size;
    for (size_t i = 0; i < alone.size(); ++i)
      ASSERT_EQ(bits(in_batch[i]), bits(alone[i])) << dir << " " << runtime::expert_backend_name(eng.backend())
                                                   << " batch " << B << (i < size_t(V) ? " prefill" : " decode step ")
                                                   << i / V << " logit " << i % V;
  }
}

}  // namespace

TEST(Engine, Bf16EvalMatchesCpu) { check_eval(tiny(), runtime::ExpertBackend::kAuto, false, kBf16NatsTol); }

TEST(Engine, CompressedW4A4EvalMatchesCpu) {
  ASSERT_FALSE(compressed().empty()) << "set MOESQ_TINY_COMPRESSED to a `moesq compress --method sgptq` output";
  check_eval(compressed(), runtime::ExpertBackend::kAuto, true, kW4A4NatsTol);
}

TEST(Engine, CompressedW4A16AndBf16EvalMatchCpu) {
  ASSERT_FALSE(compressed().empty()) << "set MOESQ_TINY_COMPRESSED";
  check_eval(compressed(), runtime::ExpertBackend::kSparseW4A16, false, kCompressedNatsTol);
  check_eval(compressed(), runtime::ExpertBackend::kBf16, false, kCompressedNatsTol);
}

// Mixtral (no q/k norm), OLMoE (whole-projection q/k norm, no renormalisation), Qwen2-MoE (q/k/v
// biases, a gated shared expert, a dense layer) — random-weight fixtures with head_dim 32 — and
// DeepSeek-V3 (multi-head latent attention with its latent cache, sigmoid grouped router, shared
// expert, a first dense layer) and gpt-oss (sink attention with a 64-token window on its sliding
// layer — the 100–160-token windows cross it — YaRN RoPE, q/k/v/o biases, the biased top-k-softmax
// router, biased clamped-SwiGLU experts): the engine's per-window nats against the CPU forward (bf16
// experts: the W16A16 floor of kBf16NatsTol; the MLA latent cache is bf16 like the GQA K/V), and a
// sequence's bits alone = in batches of 8 and 64. Qwen3-Next and Qwen3.5 (hybrids): three Gated DeltaNet
// layers (per-slot conv window and recurrent state) and one gated attention layer (q heads [query |
// gate], zero-centred q/k norms, RoPE over 8 of 32 dims), a gated shared expert.
const char* const kGpuFamilies[] = {"tiny-mixtral",  "tiny-olmoe",      "tiny-qwen2-moe",  "tiny-deepseek-v3",
                                    "tiny-gpt-oss", "tiny-qwen3-next", "tiny-qwen3.5-moe"};
std::string family_dir(const char* name) { return std::string(MOESQ_FIXTURES) + "/families/" + name; }

TEST(Engine, FamiliesEvalMatchCpu) {
  for (const char* f : kGpuFamilies) check_eval(family_dir(f), runtime::ExpertBackend::kBf16, false, kBf16NatsTol);
}

TEST(Engine, FamiliesDeterministicBatchInvariance) {
  for (const char* f : kGpuFamilies) check_batch_invariance(family_dir(f), runtime::ExpertBackend::kBf16);
}

// A compressed gpt-oss (MOESQ_GPT_OSS_COMPRESSED = `moesq compress tests/fixtures/families/tiny-gpt-oss
// --method sgptq --calib-samples 32`: paired 4:8 NVFP4 experts, their biases kept) on the sparse
// backends: the biases and the clamped SwiGLU run between the sparse GEMMs (W4A4 against the CPU's W4A4
// forward, W4A16 against its W16 one), within the qwen3 fixture's bounds.
TEST(Engine, CompressedGptOssEvalMatchesCpu) {
  const char* p = std::getenv("MOESQ_GPT_OSS_COMPRESSED");
  ASSERT_TRUE(p && *p) << "set MOESQ_GPT_OSS_COMPRESSED to a `moesq compress` output of tiny-gpt-oss";
  check_eval(p, runtime::ExpertBackend::kSparseW4A4, true, kW4A4NatsTol);
  check_eval(p, runtime::ExpertBackend::kSparseW4A16, false, kCompressedNatsTol);
}

// The MoE block run in slices of 5 tokens (EngineOptions::moe_tokens) gives a batched prefill of 4
// windows and the decode steps after it the bits of the unsliced engine: every op of the block is
// batch-invariant, so the slicing that keeps Kimi-K2.5's 384-expert workspace in memory is free of error.
TEST(Engine, MoeSlicesDoNotChangeBits) {
  const io::Checkpoint ckpt(tiny());
  std::vector<std::vector<float>> runs;
  for (int64_t moe_tokens : {int64_t{0}, int64_t{5}}) {
    runtime::EngineOptions opt;
    opt.max_seqs = 4, opt.max_len = 96, opt.moe_tokens = moe_tokens;
    runtime::Engine eng(ckpt, opt);
    std::vector<runtime::SeqChunk> chunks;
    for (int w = 0; w < 4; ++w) chunks.push_back({w, text_tokens(30 + 7 * w, 50 + w)});
    std::vector<float> z = eng.forward(chunks, true);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> d = eng.decode({1, 2, 3, 4});
      z.insert(z.end(), d.begin(), d.end());
    }
    runs.push_back(z);
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) ASSERT_EQ(bits(runs[1][i]), bits(runs[0][i])) << "logit " << i;
}

// With DeepSeek-V3's MLA the prefill runs mla_attention's sequential path and each decode step (T = 1)
// its split-KV path: the two must give the same bits (ops/mla/mla.h), so there the check is bitwise.
std::string family_dir(const char* name);
TEST(Engine, DecodeGraphEqualsPrefill) {
  for (const std::string& dir : {tiny(), compressed(), family_dir("tiny-deepseek-v3"), family_dir("tiny-qwen3-next")}) {
    if (dir.empty()) continue;
    const io::Checkpoint ckpt(dir);
    runtime::EngineOptions opt;
    opt.max_seqs = 1, opt.max_len = 64;
    runtime::Engine eng(ckpt, opt);
    const std::vector<int32_t> seq = text_tokens(48, 3);
    const std::vector<float> all = eng.forward({{0, seq}}, true);
    eng.reset();
    const int64_t V = eng.spec().vocab_size;
    std::vector<float> z = eng.forward({{0, std::vector<int32_t>(seq.begin(), seq.begin() + 32)}}, false);
    int bitwise = 0, total = 0;
    for (int t = 31; t < 48; ++t) {
      if (t > 31) z = eng.decode({seq[t]});
      for (int64_t v = 0; v < V; ++v) {
        const float a = all[t * V + v], b = z[v];
        EXPECT_NEAR(b, a, kDecodeLogitTol) << dir << " position " << t << " logit " << v;
        bitwise += bits(a) == bits(b), ++total;
      }
    }
    std::printf("[engine] %s decode vs prefill: %d of %d logits bitwise equal\n", dir.c_str(), bitwise, total);
    if (dir.find("deepseek") != std::string::npos) EXPECT_EQ(bitwise, total) << dir;
    EXPECT_EQ(eng.length(0), 48);
  }
}

// Logits of `seq` prefilled alone into slot 0, then one decode step per token of `next` over
// slots {0}: [1 + next.size(), V].
std::vector<float> alone_in_slot0(runtime::Engine& eng, const std::vector<int32_t>& seq, const std::vector<int32_t>& next) {
  eng.reset();
  std::vector<float> out = eng.forward({{0, seq}}, false);
  for (int32_t tok : next) {
    const std::vector<float> z = eng.decode({0}, {tok});
    out.insert(out.end(), z.begin(), z.end());
  }
  return out;
}

void expect_bits(const float* got, const float* want, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(got[i]), bits(want[i])) << what << " logit " << i;
}

// Two sequences prefilled into slots {3, 1} and decoded together (their order in the slot list
// alternating), then prefilled into slots {0, 2} and decoded through the SAME batch-2 graph with
// another slot list: every row's logits are bitwise those of its sequence alone in slot 0.
TEST(Engine, DecodeOverAnySlotsEqualsAloneInSlotZero) {
  const io::Checkpoint ckpt(tiny());
  runtime::EngineOptions opt;
  opt.max_seqs = 4, opt.max_len = 96;
  runtime::Engine eng(ckpt, opt);
  const int64_t V = eng.spec().vocab_size;
  const std::vector<int32_t> a = text_tokens(20, 5), b = text_tokens(47, 6);  // other lengths: other chunk counts
  const std::vector<int32_t> na = text_tokens(24, 7), nb = text_tokens(24, 8);
  const int steps = static_cast<int>(na.size());
  const std::vector<float> za = alone_in_slot0(eng, a, na), zb = alone_in_slot0(eng, b, nb);
  struct Placement {
    int slot_a, slot_b;
  };
  for (const Placement p : {Placement{3, 1}, Placement{2, 0}}) {
    const std::string where = "slots a=" + std::to_string(p.slot_a) + " b=" + std::to_string(p.slot_b);
    eng.reset();
    const std::vector<float> pa = eng.forward({{p.slot_a, a}}, false);
    const std::vector<float> pb = eng.forward({{p.slot_b, b}}, false);
    expect_bits(pa.data(), za.data(), V, where + " prefill a");
    expect_bits(pb.data(), zb.data(), V, where + " prefill b");
    for (int i = 0; i < steps; ++i) {
      const bool a_first = i % 2 == 0;
      const std::vector<int32_t> slots = a_first ? std::vector<int32_t>{p.slot_a, p.slot_b}
                                                 : std::vector<int32_t>{p.slot_b, p.slot_a};
      const std::vector<int32_t> toks = a_first ? std::vector<int32_t>{na[i], nb[i]} : std::vector<int32_t>{nb[i], na[i]};
      const std::vector<float> z = eng.decode(slots, toks);
      ASSERT_EQ(static_cast<int64_t>(z.size()), 2 * V);
      const float* ra = z.data() + (a_first ? 0 : V);
      const float* rb = z.data() + (a_first ? V : 0);
      expect_bits(ra, za.data() + (i + 1) * V, V, where + " decode step " + std::to_string(i) + " a");
      expect_bits(rb, zb.data() + (i + 1) * V, V, where + " decode step " + std::to_string(i) + " b");
    }
    EXPECT_EQ(eng.length(p.slot_a), static_cast<int64_t>(a.size() + na.size())) << where;
    EXPECT_EQ(eng.length(p.slot_b), static_cast<int64_t>(b.size() + nb.size())) << where;
  }
  // decode_greedy over a slot list: the argmax (lowest id on ties) of each row's logits.
  eng.reset();
  eng.forward({{3, a}}, false);
  eng.forward({{1, b}}, false);
  const std::vector<int32_t> g = eng.decode_greedy({1, 3}, {nb[0], na[0]});
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0], std::max_element(zb.begin() + V, zb.begin() + 2 * V) - (zb.begin() + V));
  EXPECT_EQ(g[1], std::max_element(za.begin() + V, za.begin() + 2 * V) - (za.begin() + V));
  // Bad slot lists are errors before any work.
  EXPECT_THROW(eng.decode({1, 1}, {0, 0}), Error);
  EXPECT_THROW(eng.decode({4}, {0}), Error);
  EXPECT_THROW(eng.decode({0, 1}, {0}), Error);
  EXPECT_THROW(eng.reset(4), Error);
}

// A hybrid's per-slot Gated DeltaNet states (Qwen3-Next fixture): two sequences prefilled in ONE forward
// into slots {3, 1} and decoded together give the bits of each alone in slot 0; reset(3) then starts a
// third sequence in slot 3 from a zero state while slot 1's goes on untouched; a slot given in two
// chunks of one forward is refused before anything runs.
TEST(Engine, HybridSlotStatesFollowTheirSequences) {
  const io::Checkpoint ckpt(family_dir("tiny-qwen3-next"));
  runtime::EngineOptions opt;
  opt.max_seqs = 4, opt.max_len = 96;
  runtime::Engine eng(ckpt, opt);
  const int64_t V = eng.spec().vocab_size;
  const std::vector<int32_t> a = text_tokens(20, 5), b = text_tokens(47, 6), c = text_tokens(13, 9);
  const std::vector<int32_t> na = text_tokens(12, 7), nb = text_tokens(24, 8), nc = text_tokens(12, 10);
  const std::vector<float> za = alone_in_slot0(eng, a, na), zb = alone_in_slot0(eng, b, nb);
  const std::vector<float> zc = alone_in_slot0(eng, c, nc);
  eng.reset();
  const std::vector<float> p = eng.forward({{3, a}, {1, b}}, false);
  expect_bits(p.data(), za.data(), V, "prefill a in slot 3");
  expect_bits(p.data() + V, zb.data(), V, "prefill b in slot 1");
  for (size_t i = 0; i < na.size(); ++i) {
    const std::vector<float> z = eng.decode({1, 3}, {nb[i], na[i]});
    expect_bits(z.data(), zb.data() + (i + 1) * V, V, "decode step " + std::to_string(i) + " b");
    expect_bits(z.data() + V, za.data() + (i + 1) * V, V, "decode step " + std::to_string(i) + " a");
  }
  eng.reset(3);  // a's state goes; c starts from zero in its slot while b continues
  const std::vector<float> pc = eng.forward({{3, c}}, false);
  expect_bits(pc.data(), zc.data(), V, "prefill c in the reset slot 3");
  for (size_t i = 0; i < nc.size(); ++i) {
    const size_t j = na.size() + i;
    const std::vector<float> z = eng.decode({3, 1}, {nc[i], nb[j]});
    expect_bits(z.data(), zc.data() + (i + 1) * V, V, "decode step " + std::to_string(i) + " c");
    expect_bits(z.data() + V, zb.data() + (j + 1) * V, V, "decode step " + std::to_string(j) + " b");
  }
  const int64_t len_b = eng.length(1);
  try {
    eng.forward({{1, {1, 2}}, {2, {3}}, {1, {4}}}, false);
    ADD_FAILURE() << "a slot in two chunks of one forward was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("slot 1 has two runs"), std::string::npos) << e.what();
  }
  EXPECT_EQ(eng.length(1), len_b);
}

// runtime::Generator over the engine (EngineDecodeBackend): two greedy/sampled sequences sharing
// the decode steps give the tokens of the plain loop `moesq generate --device cuda` ran alone
// (forward into slot 0, then sample / decode({token})).
TEST(Engine, GeneratorMatchesPlainLoop) {
  const io::Checkpoint ckpt(tiny());
  runtime::EngineOptions opt;
  opt.max_seqs = 2, opt.max_len = 64;
  runtime::Engine eng(ckpt, opt);
  const int64_t V = eng.spec().vocab_size;
  const std::vector<int32_t> pa = text_tokens(11, 21), pb = text_tokens(17, 22);
  runtime::SamplerOptions sa, sb;
  sb.temperature = 0.8f, sb.top_p = 0.9f, sb.seed = 7;
  auto plain = [&](const std::vector<int32_t>& prompt, const runtime::SamplerOptions& so, int64_t n) {
    eng.reset();
    runtime::Sampler sampler(so);
    std::vector<float> z = eng.forward({{0, prompt}}, false);
    std::vector<int32_t> out;
    while (true) {
      out.push_back(sampler.next(z.data(), V));
      if (static_cast<int64_t>(out.size()) == n) break;
      z = eng.decode({out.back()});
    }
    return out;
  };
  const std::vector<int32_t> want_a = plain(pa, sa, 16), want_b = plain(pb, sb, 10);
  eng.reset();
  runtime::EngineDecodeBackend dec(eng);
  runtime::Generator gen(dec);
  runtime::StopOptions stop_a, stop_b;
  stop_a.max_new_tokens = 16, stop_b.max_new_tokens = 10;
  const int ia = gen.add(pa, sa, stop_a), ib = gen.add(pb, sb, stop_b);
  while (gen.running() > 0) gen.step();
  EXPECT_EQ(gen.output(ia), want_a);
  EXPECT_EQ(gen.output(ib), want_b);
}

namespace {
// The tiny model's engine behind the serving seam: 5 slots of 64 tokens, forwards of at most 64 tokens.
struct SeamEngine {
  static runtime::EngineOptions options() {
    runtime::EngineOptions opt;
    opt.max_seqs = 5, opt.max_len = 64, opt.max_tokens = 64;
    return opt;
  }
  io::Checkpoint ckpt{tiny()};
  runtime::Engine eng{ckpt, options()};
  runtime::EngineDecodeBackend dec{eng};
};
}  // namespace

// The serving seam (EngineDecodeBackend): prefill_batch packs prompts into forwards of at most
// max_tokens (here 3 forwards for 5 prompts) and each row is BITWISE the prompt's prefill alone;
// decode_greedy's ids are greedy_rows of decode()'s logits (argmax on the GPU = on the host).
TEST(Engine, BackendPrefillBatchIsPrefillAloneAndDecodeGreedyIsTheArgmax) {
  SeamEngine seam;
  runtime::Engine& eng = seam.eng;
  runtime::EngineDecodeBackend& dec = seam.dec;
  const int64_t V = eng.spec().vocab_size;
  std::vector<int32_t> slots = {3, 0, 4, 1, 2};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(text_tokens(9 + 11 * i, 40 + i));  // 9 .. 53 tokens
  std::vector<float> alone;
  for (int i = 0; i < 5; ++i) {
    const std::vector<float> z = dec.prefill(0, prompts[i]);
    alone.insert(alone.end(), z.begin(), z.end());
  }
  eng.reset();
  const std::vector<float> batch = dec.prefill_batch(slots, prompts);
  ASSERT_EQ(batch.size(), alone.size());
  for (size_t i = 0; i < alone.size(); ++i)
    ASSERT_EQ(bits(batch[i]), bits(alone[i])) << "prompt " << i / V << " logit " << i % V;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(eng.length(slots[i]), static_cast<int64_t>(prompts[i].size())) << i;
  const std::vector<int32_t> toks = runtime::greedy_rows(batch, V);
  // The same step twice: from copies of the slots' state is not possible, so compare the greedy ids of
  // one decode with the argmax of the logits of the same step replayed after re-prefilling.
  const std::vector<int32_t> ids = dec.decode_greedy(slots, toks);
  eng.reset();
  (void)dec.prefill_batch(slots, prompts);
  EXPECT_EQ(ids, runtime::greedy_rows(dec.decode(slots, toks), V));
}

// Chunked prefill through the seam (what `serve` does with --max-num-batched-tokens): each prompt cut
// into pieces of 7 tokens, the pieces of all five prompts interleaved over several prefill_chunks calls,
// gives every prompt's last-token logits BITWISE those of its prefill alone on the tiny model (the
// deterministic engine depends neither on the batch nor on the chunk boundaries).
TEST(Engine, ChunkedPrefillEqualsWholePrefillBitwise) {
  SeamEngine seam;
  runtime::Engine& eng = seam.eng;
  runtime::EngineDecodeBackend& dec = seam.dec;
  const int64_t V = eng.spec().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(text_tokens(9 + 11 * i, 60 + i));  // 9 .. 53 tokens
  std::vector<std::vector<float>> alone;
  for (int i = 0; i < 5; ++i) alone.push_back(dec.prefill(0, prompts[i]));
  eng.reset();
  std::vector<size_t> done(5, 0);
  std::vector<std::vector<float>> last(5);
  for (int round = 0; round < 20; ++round) {
    std::vector<runtime::PrefillChunk> chunks;
    std::vector<int> who;
    for (int i = 0; i < 5; ++i) {
      if (done[i] == prompts[i].size() || (round + i) % 3 == 0) continue;  // not every prompt every round
      const size_t n = std::min<size_t>(7, prompts[i].size() - done[i]);
      chunks.push_back({i, std::vector<int32_t>(prompts[i].begin() + done[i], prompts[i].begin() + done[i] + n), done[i] == 0});
      who.push_back(i);
      done[i] += n;
    }
    if (chunks.empty()) continue;
    const std::vector<float> z = dec.prefill_chunks(chunks);
    ASSERT_EQ(z.size(), chunks.size() * static_cast<size_t>(V));
    for (size_t k = 0; k < who.size(); ++k) last[who[k]].assign(z.begin() + k * V, z.begin() + (k + 1) * V);
  }
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(done[i], prompts[i].size()) << "prompt " << i << " not fully prefilled";
    EXPECT_EQ(eng.length(i), static_cast<int64_t>(prompts[i].size())) << i;
    ASSERT_EQ(last[i].size(), alone[i].size());
    size_t differ = 0;
    for (size_t v = 0; v < alone[i].size(); ++v) differ += bits(last[i][v]) != bits(alone[i][v]);
    EXPECT_EQ(differ, 0u) << "prompt " << i << ": " << differ << " logits differ from its prefill alone";
  }
}

// Paged KV: a sequence whose blocks are scattered through a 5-block pool (another slot's blocks taken
// and freed first, so it gets blocks 0, 3, 4) decodes, through the decode graphs, to the ids and last
// logits it gets in an engine where every slot owns its blocks (the default pool): paging changes
// addresses, never bits. A prefill the free blocks do not cover is KvCacheFull and changes nothing.
TEST(Engine, PagedKvBlocksDoNotChangeBits) {
  const io::Checkpoint ckpt(tiny());
  runtime::EngineOptions opt;
  opt.max_seqs = 3, opt.max_len = 200, opt.max_tokens = 200;
  const std::vector<int32_t> prompt = text_tokens(70, 91);
  auto run = [&](runtime::Engine& eng, std::vector<float>& last) {
    std::vector<float> z = eng.forward({{0, prompt}}, false);
    std::vector<int32_t> ids{runtime::greedy_rows(z, eng.spec().vocab_size)[0]};
    for (int step = 0; step < 69; ++step) ids.push_back(eng.decode_greedy({0}, {ids.back()})[0]);
    last = eng.decode({0}, {ids.back()});  // position 139: the third block
    return ids;
  };
  std::vector<float> last_full, last_paged;
  runtime::Engine full(ckpt, opt);
  EXPECT_EQ(full.kv_blocks(), 3 * 4);
  const std::vector<int32_t> want = run(full, last_full);
  opt.kv_tokens = 5 * 64;
  runtime::Engine paged(ckpt, opt);
  ASSERT_EQ(paged.kv_blocks(), 5);
  paged.forward({{1, text_tokens(64, 92)}}, false);  // block 0
  paged.forward({{2, text_tokens(65, 93)}}, false);  // blocks 1, 2
  paged.reset(1);                                     // block 0 free again
  EXPECT_EQ(paged.kv_free_blocks(), 3);
  const std::vector<int32_t> got = run(paged, last_paged);
  EXPECT_EQ(paged.kv_free_blocks(), 0);
  EXPECT_EQ(got, want);
  ASSERT_EQ(last_paged.size(), last_full.size());
  size_t differ = 0;
  for (size_t v = 0; v < last_full.size(); ++v) differ += bits(last_paged[v]) != bits(last_full[v]);
  EXPECT_EQ(differ, 0u) << differ << " logits differ with scattered blocks";
  EXPECT_THROW(paged.forward({{1, text_tokens(10, 94)}}, false), runtime::KvCacheFull);
  EXPECT_EQ(paged.length(1), 0);
  EXPECT_EQ(paged.kv_free_blocks(), 0);
  paged.reset(0);
  EXPECT_EQ(paged.kv_free_blocks(), 3);
  EXPECT_NO_THROW(paged.forward({{1, text_tokens(10, 94)}}, false));
}

TEST(Engine, DeterministicBatchInvarianceBf16) { check_batch_invariance(tiny(), runtime::ExpertBackend::kBf16); }

TEST(Engine, DeterministicBatchInvarianceSparse) {
  ASSERT_FALSE(compressed().empty()) << "set MOESQ_TINY_COMPRESSED";
  check_batch_invariance(compressed(), runtime::ExpertBackend::kSparseW4A4);
  check_batch_invariance(compressed(), runtime::ExpertBackend::kSparseW4A16);
}

// --deterministic off (cuBLAS for the non-expert GEMMs): same model, other summation order: prefill
// nats within the bf16 tolerance of the deterministic mode, and decode (graph-captured cuBLAS) runs.
TEST(Engine, NonDeterministicModeAgreesWithDeterministic) {
  const io::Checkpoint ckpt(tiny());
  runtime::EngineOptions opt;
  opt.max_seqs = 1, opt.max_len = 160;
  runtime::Engine eng(ckpt, opt);
  const std::vector<int32_t> w = text_tokens(120, 41);
  const int64_t V = eng.spec().vocab_size;
  const double on = nll(eng.forward({{0, w}}, true).data(), V, w);
  eng.reset();
  eng.set_deterministic(false);
  EXPECT_FALSE(eng.deterministic());
  const double off = nll(eng.forward({{0, w}}, true).data(), V, w);
  std::printf("[engine] deterministic on %.6f off %.6f nats\n", on, off);
  EXPECT_LE(std::fabs(on - off), kBf16NatsTol);
  const std::vector<float> z = eng.decode({w[0]});
  ASSERT_EQ(static_cast<int64_t>(z.size()), V);
  for (float v : z) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(eng.length(0), 121);
}

TEST(Engine, UnbuiltAndMismatchedBackendsAreClearErrors) {
  const io::Checkpoint ckpt(tiny());
  runtime::EngineOptions opt;
  opt.max_len = 16;
  for (auto b : {runtime::ExpertBackend::kAwqW4A16, runtime::ExpertBackend::kNvfp4W4A16}) {
    opt.experts = b;
    try {
      runtime::Engine eng(ckpt, opt);
      ADD_FAILURE() << "no error for " << runtime::expert_backend_name(b);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("built: bf16, sparse-w4a4, sparse-w4a16"), std::string::npos) << e.what();
    }
  }
  opt.experts = runtime::ExpertBackend::kSparseW4A4;
  EXPECT_THROW(runtime::Engine(ckpt, opt), Error);
}

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }

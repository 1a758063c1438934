// Launchers: the two sequential stages of a Gated DeltaNet layer (model/mixers/gated_deltanet.h is the
// CPU mixer; Yang, Kautz, Hatamizadeh 2024, Eq. 10) for the GPU engine, over the runs of tokens of
// several sequences in one call, each run continuing its slot's state:
//
//   gdn_conv        [q | k | v] = SiLU(causal depthwise conv1d over the slot's last Kc−1 inputs and the
//                   run), the slot's conv window then moved to the run's last Kc−1 inputs;
//   gdn_recurrence  per value head h (key head h / (nv/nk)), token by token in the run:
//                   q, k L2-normalised (ε 1e-6), q · dk^-½; α = exp(−exp(A_log) · softplus(a + dt_bias)),
//                   β = σ(b); S ← α S; δ = β (v − Sᵀk); S ← S + k δᵀ; o = Sᵀq;
//                   o ← norm ⊙ o / rms(o) ⊙ SiLU(z) (gated RMSNorm, fp64 sum of squares)
//                   — the mixer's recurrent form, S [dk, dv] fp32 per (slot, value head).
//
// The projections before (in_proj_qkv | z | b | a, one GEMM) and out_proj after are GEMMs the caller
// runs. A token's bits depend only on its slot's history: one CTA walks one run (batch-invariant),
// and a run of T tokens gives the bits of T runs of one token (prefill = decode).
//
// Reduction orders (the twins follow them; only expf / the transcendental rounding differs from the
// GPU's, so GPU vs twin is compared within kGdnTolerance): the conv sums taps j = 0..Kc−1 by fma; the
// L2 norms sum squares per lane (i ≡ lane mod 32, ascending) then butterfly 1, 2, 4, 8, 16; Sᵀk and Sᵀq
// sum each 32-row group of S by fma in ascending rows, then the groups in ascending order; the gated
// RMSNorm sums squares in fp64 the L2 norm's way.
//
// Two forms of each, the SAME bits (every value goes through the same operations in the same order;
// tests/ops/test_gdn_forms.cpp on the twins, tests/gpu/test_gdn_ops.cu on the kernels):
//  - walk (decode, one token per run): one kernel each, a run's tokens walked in order as above;
//  - parallel (prefill, runs of many tokens): gdn_conv computes every token's conv at once (a token's
//    Kc−1 earlier inputs come from its run or, before the run, from the slot's window), then moves the
//    windows on; gdn_recurrence runs three kernels — the per-token L2 norms and gates of every token at
//    once (q̂, k̂, α, β written over q, k, a, b: the caller's scratch, consume_inputs), the state walk split
//    over 32-column blocks of S (the columns of S never meet: one CTA per block, value head and run, with
//    a fifth of the walk's barriers and the next token's inputs prefetched; its raw o written over v), then
//    the gated RMSNorm of every token at once.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

// automatic: parallel when the host knows the call has a run of more than one token (tokens > runs)
// and, for the recurrence, consume_inputs; else walk.
enum class GdnForm { automatic, walk, parallel };

constexpr int kGdnMaxConvKernel = 8;   // Kc built (Qwen3-Next / Qwen3.5: 4)
constexpr double kGdnTolerance = 2e-5; // GPU vs twin, max |Δ| / max |twin| per output (expf's rounding)

// The runs of one call: run r is rows [run_start[r], run_start[r+1]) of the call's [T, ·] inputs,
// consecutive tokens of slot run_slot[r] (each slot at most once per call).
struct GdnRuns {
  const int32_t* run_start = nullptr;  // [runs + 1], run_start[0] = 0, run_start[runs] = T
  const int32_t* run_slot = nullptr;   // [runs] in [0, slots)
  int runs = 0;
  int slots = 0;
};

struct GdnConvArgs {
  const float* x = nullptr;  // [T, ldx] fp32: columns 0..C−1 are in_proj_qkv's outputs
  int64_t ldx = 0;
  const float* w = nullptr;  // [C, Kc] fp32, tap Kc−1 multiplies the current token
  float* window = nullptr;   // [slots, C, Kc−1] fp32, oldest first: read, then moved on
  float* out = nullptr;      // [T, C] fp32 SiLU(conv)
  GdnRuns runs;
  int C = 0, Kc = 0;
  // false: the windows are read, not moved on (the outputs are the same). The engine's eager decode
  // step before a graph capture runs so, since the captured replay then takes the same step again.
  bool update_state = true;
  GdnForm form = GdnForm::automatic;
  int64_t tokens = 0;  // the call's T (= run_start[runs]) as the host knows it, for automatic and parallel
};

struct GdnRecurrenceArgs {
  const float* qkv = nullptr;  // [T, 2·nk·dk + nv·dv] gdn_conv's out: q (nk·dk) | k (nk·dk) | v (nv·dv)
  const float* z = nullptr;    // [T, ldz] columns 0..nv·dv−1: in_proj_z's outputs
  const float* b = nullptr;    // [T, ldz] columns 0..nv−1: in_proj_b's
  const float* a = nullptr;    // [T, ldz] columns 0..nv−1: in_proj_a's
  int64_t ldz = 0;
  const float* A_log = nullptr;    // [nv]
  const float* dt_bias = nullptr;  // [nv]
  const float* norm = nullptr;     // [dv] gated-RMSNorm weight (w, not 1 + w)
  float* S = nullptr;              // [slots, nv, dk, dv] fp32: read, then left after each run's last token
  float* out = nullptr;            // [T, nv·dv] fp32 gated-normed o (or nullptr)
  uint16_t* out_hi = nullptr;      // [T, nv·dv] bf16 hi + lo of the same values (out_proj's input), or nullptr
  uint16_t* out_lo = nullptr;
  GdnRuns runs;
  // dk ∈ {32, 64, 128, 256}; dv a multiple of 32 with dv · dk/32 ≤ 512 (a thread per 32 rows of a
  // column); nv % nk == 0.
  int nk = 0, dk = 0, nv = 0, dv = 0;
  double eps = 1e-6;                   // gated RMSNorm
  bool update_state = true;            // false: S is read, not written (GdnConvArgs::update_state)
  GdnForm form = GdnForm::automatic;
  int64_t tokens = 0;                  // the call's T, as GdnConvArgs::tokens
  // true: the parallel form may overwrite qkv's q, k, v columns and a, b (read by nothing after this
  // call: the engine's scratch); the parallel form is refused without it.
  bool consume_inputs = false;
};

// The form a call takes (GdnForm). Error: parallel asked without tokens > 0, or for the recurrence
// without consume_inputs.
bool gdn_conv_parallel(const GdnConvArgs& args);
bool gdn_recurrence_parallel(const GdnRecurrenceArgs& args);

// Errors (both sides): sizes outside the built ranges (naming them), null pointers, runs that are not
// ascending or cover other than [0, T) is checked on the host twin only (the launcher reads nothing back).
void gdn_conv(const GdnConvArgs& args, cudaStream_t stream);
void gdn_conv_ref(const GdnConvArgs& args);  // host pointers; also checks the runs
void gdn_recurrence(const GdnRecurrenceArgs& args, cudaStream_t stream);
void gdn_recurrence_ref(const GdnRecurrenceArgs& args);  // host pointers; also checks the runs
void gdn_conv_check(const GdnConvArgs& args);
void gdn_recurrence_check(const GdnRecurrenceArgs& args);

}  // namespace moesq::ops

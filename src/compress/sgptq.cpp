// SGPTQ for paired 4:8 NVFP4 (see sgptq.h for the algorithm and the scale-block decision).
// Non-obvious decision: the solver packs the E2M1/UE4M3 codes it rounded with itself instead of
// calling sparse48_quantize on the rounded weights, because GPTQ fixes a block's UE4M3 code when the
// block starts and later in-block updates can move the block maximum: re-deriving the code from the
// rounded values would then pick a different code and re-round values GPTQ already compensated for.
// The layout written is exactly the one documented in format/nvfp4.h (tests check it against
// sparse48_quantize/sparse48_dequantize).
#include "compress/sgptq.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "format/fp_codecs.h"

namespace moesq::compress {

namespace {

using format::kGroup;
using format::kNumPatterns;
using format::kPatternPairs;
using format::kSparseScaleBlock;

constexpr int kPairsPerGroup = kGroup / 2;
constexpr int kGroupsPerScaleBlock = kSparseScaleBlock / kGroup;
static_assert(kSparseScaleBlock % kGroup == 0, "a scale block must hold whole 4:8 groups");

// Everything the column loop needs, after damping / dead columns / fallback.
struct Prepared {
  std::vector<double> Wt;  // [K, N] fp64, the weights transposed (column i contiguous)
  std::vector<double> U;   // [K, K] upper Cholesky factor of H⁻¹ (identity on fallback)
  bool fallback = false;
  std::string reason;
  int64_t dead = 0;
};

Prepared prepare(const float* W, int64_t N, int64_t K, const Hessian& h, const SgptqOptions& opt,
                 const std::string& name, bool use_blas) {
  sgptq_check_weights(W, N, K, opt, name);
  MOESQ_CHECK(h.n == 0 || h.K == K, "sgptq: tensor ", name, " has K=", K,
              " but its Hessian has K=", h.K);
  MOESQ_CHECK(h.n == 0 || static_cast<int64_t>(h.H.size()) == K * K, "sgptq: Hessian of ", name,
              " holds ", h.H.size(), " values, expected K*K with K=", K);

  Prepared p;
  p.Wt.resize(static_cast<size_t>(K * N));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t k = 0; k < K; ++k) p.Wt[k * N + r] = W[r * K + k];

  auto identity = [&](std::string why) {
    p.fallback = true;
    p.reason = std::move(why);
    p.dead = 0;
    p.U.assign(static_cast<size_t>(K * K), 0.0);
    for (int64_t k = 0; k < K; ++k) p.U[k * K + k] = 1.0;
    // Undo any dead-column zeroing: the fallback is plain magnitude + RTN on the given weights.
    for (int64_t r = 0; r < N; ++r)
      for (int64_t k = 0; k < K; ++k) p.Wt[k * N + r] = W[r * K + k];
  };

  if (h.n == 0) {
    identity("no calibration tokens: identity Hessian");
    return p;
  }
  if (h.n < opt.min_tokens) {
    identity("only " + std::to_string(h.n) + " calibration tokens (< min_tokens " +
             std::to_string(opt.min_tokens) + "): identity Hessian");
    return p;
  }
  for (double v : h.H)
    if (!std::isfinite(v)) {
      identity("non-finite Hessian: identity Hessian");
      return p;
    }

  std::vector<double> H = h.H;
  // Dead inputs (never non-zero in the calibration rows): GPTQ sets H_ii = 1 and W[:, i] = 0 —
  // the weight cannot affect the calibration outputs, so zero is the error-free choice.
  for (int64_t k = 0; k < K; ++k)
    if (H[k * K + k] == 0.0) {
      H[k * K + k] = 1.0;
      std::fill(p.Wt.begin() + k * N, p.Wt.begin() + (k + 1) * N, 0.0);
      ++p.dead;
    }
  double mean_diag = 0.0;
  for (int64_t k = 0; k < K; ++k) mean_diag += H[k * K + k];
  mean_diag /= static_cast<double>(K);
  const double damp = opt.percdamp * mean_diag;
  for (int64_t k = 0; k < K; ++k) H[k * K + k] += damp;

  const bool ok =
      use_blas ? inverse_cholesky_upper(H, K, p.U) : inverse_cholesky_upper_ref(H, K, p.U);
  if (!ok) {
    identity("Hessian not positive definite after damping (percdamp " +
             std::to_string(opt.percdamp) + ", " + std::to_string(h.n) +
             " tokens): identity Hessian");
  }
  return p;
}

// Best pattern of one group for one row: keep the 2 pairs with the largest Σ w²/d²
// (SparseGPT saliency); ties → lower pattern id, as format::magnitude_patterns.
uint8_t choose_pattern(const double* Wt, const double* U, int64_t N, int64_t K, int64_t r,
                       int64_t c0) {
  double pair_score[kPairsPerGroup];
  for (int pr = 0; pr < kPairsPerGroup; ++pr) {
    double s = 0.0;
    for (int e = 0; e < 2; ++e) {
      const int64_t j = c0 + 2 * pr + e;
      const double w = Wt[j * N + r];
      const double d = U[j * K + j];
      s += w * w / (d * d);
    }
    pair_score[pr] = s;
  }
  int best = 0;
  double best_score = -1.0;
  for (int pt = 0; pt < kNumPatterns; ++pt) {
    const double s = pair_score[kPatternPairs[pt][0]] + pair_score[kPatternPairs[pt][1]];
    if (s > best_score) {
      best_score = s;
      best = pt;
    }
  }
  return static_cast<uint8_t>(best);
}

// Slot (0..3) of in-group offset o among the kept values of pattern pt, or -1 when pruned.
int kept_slot(int pt, int o) {
  const int pair = o / 2;
  if (pair == kPatternPairs[pt][0]) return o % 2;
  if (pair == kPatternPairs[pt][1]) return 2 + o % 2;
  return -1;
}

// UE4M3 code of one scale block: c = UE4M3(γ · amax / 6) over the kept, current weights.
uint8_t block_scale_code(const double* Wt, int64_t N, int64_t r, int64_t s0,
                         const uint8_t* row_patterns, float gamma) {
  float amax = 0.0f;
  for (int64_t j = s0; j < s0 + kSparseScaleBlock; ++j) {
    const int pt = row_patterns[j / kGroup];
    if (kept_slot(pt, static_cast<int>(j % kGroup)) < 0) continue;
    amax = std::max(amax, std::fabs(static_cast<float>(Wt[j * N + r])));
  }
  return format::ue4m3_encode(gamma * amax / format::kE2M1Max);
}

// Codes of one solve before packing.
struct Codes {
  std::vector<uint8_t> scale;  // [N, K/32] UE4M3
  std::vector<uint8_t> value;  // [N, K/2] E2M1, one per byte
};

// At a scale-block boundary i (i % 32 == 0): the patterns of the block's 4 groups (SparseGPT choice
// on the updated weights), then the block's UE4M3 code; block_dec[r] = its decoded value.
// With a given support (fixed_support), the patterns are kept as they are.
void start_scale_block(const double* Wt, const double* U, int64_t N, int64_t K, int64_t i, float gamma,
                       bool fixed_support, SgptqResult& res, Codes& codes, std::vector<float>& block_dec) {
  const int64_t G = K / kGroup, S = K / kSparseScaleBlock;
  for (int64_t r = 0; r < N; ++r) {
    uint8_t* rp = res.patterns.data() + r * G;
    if (!fixed_support)
      for (int g = 0; g < kGroupsPerScaleBlock; ++g) rp[i / kGroup + g] = choose_pattern(Wt, U, N, K, r, i + g * kGroup);
    const uint8_t c = block_scale_code(Wt, N, r, i, rp, gamma);
    codes.scale[r * S + i / kSparseScaleBlock] = c;
    block_dec[r] = format::e4m3_decode(c);
  }
}

// Column i of every row: quantize the kept weights (the fp32 order of format/nvfp4.cpp:
// q = E2M1(w · (γ/s)), ŵ = (dec(q) · s) / γ), keep the pruned ones as they are in dense_rounded,
// write the GPTQ error e = (w − q)/d into ei [N] and add ½e² to `loss` (row order).
void quantize_column(const double* wi, int64_t N, int64_t K, int64_t i, double d, float gamma,
                     const std::vector<float>& block_dec, SgptqResult& res, Codes& codes, double* ei, double& loss) {
  const int64_t G = K / kGroup;
  for (int64_t r = 0; r < N; ++r) {
    const int pt = res.patterns[r * G + i / kGroup];
    const int slot = kept_slot(pt, static_cast<int>(i % kGroup));
    const double w = wi[r];
    double q = 0.0;
    if (slot >= 0) {
      const float s = block_dec[r];
      uint8_t code = 0;
      float qf = 0.0f;
      if (s > 0.0f) {
        code = format::e2m1_encode(static_cast<float>(w) * (gamma / s));
        qf = format::e2m1_decode(code) * s / gamma;
      }
      codes.value[r * (K / 2) + (i / kGroup) * kPairsPerGroup + slot] = code;
      q = qf;
      res.dense_rounded[r * K + i] = qf;
    } else {
      res.dense_rounded[r * K + i] = static_cast<float>(w);
    }
    const double e = (w - q) / d;
    ei[r] = e;
    loss += 0.5 * e * e;
  }
}

// In-block update of the later columns i+1 .. b1-1: W[:, j] −= e · U_ij (a rank-1 update).
void update_in_block(const double* U, int64_t N, int64_t K, int64_t i, int64_t b1, const double* ei, double* Wt,
                     bool use_blas) {
  if (use_blas && i + 1 < b1) {
    cblas_dger(CblasRowMajor, static_cast<int>(b1 - i - 1), static_cast<int>(N), -1.0, U + i * K + i + 1, 1, ei, 1,
               Wt + (i + 1) * N, static_cast<int>(N));
    return;
  }
  for (int64_t j = i + 1; j < b1; ++j) {
    const double u = U[i * K + j];
    double* wj = Wt + j * N;
    for (int64_t r = 0; r < N; ++r) wj[r] -= ei[r] * u;
  }
}

// Lazy update of the columns after the block [b0, b1): Wt[b1:K, :] −= U[b0:b1, b1:K]ᵀ · err.
void update_after_block(const double* U, int64_t N, int64_t K, int64_t b0, int64_t b1, const std::vector<double>& err,
                        double* Wt, bool use_blas) {
  const int64_t nb = b1 - b0, rest = K - b1;
  if (use_blas) {
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(rest), static_cast<int>(N),
                static_cast<int>(nb), -1.0, U + b0 * K + b1, static_cast<int>(K), err.data(), static_cast<int>(N), 1.0,
                Wt + b1 * N, static_cast<int>(N));
    return;
  }
  for (int64_t j = b1; j < K; ++j)
    for (int64_t ii = 0; ii < nb; ++ii) {
      const double u = U[(b0 + ii) * K + j];
      const double* e = err.data() + ii * N;
      for (int64_t r = 0; r < N; ++r) Wt[j * N + r] -= e[r] * u;
    }
}

// Core column loop. block = lazy-update block; use_blas = LAPACK factorisation and BLAS updates.
// block == K with no BLAS is the _ref twin. fixed: a given support [N, K/8] (null: SparseGPT choice);
// columns before gptq_from are rounded without propagating their error (RTN).
SgptqResult solve(const float* W, int64_t N, int64_t K, const Hessian& h, float gamma,
                  const SgptqOptions& opt, const std::string& name, int64_t block, bool use_blas,
                  const uint8_t* fixed = nullptr, int64_t gptq_from = 0) {
  Prepared p = prepare(W, N, K, h, opt, name, use_blas);
  if (!(gamma > 0.0f)) gamma = format::nvfp4_tensor_scale(format::amax_abs(W, N * K));
  MOESQ_CHECK(std::isfinite(gamma), "sgptq: tensor ", name, " has a non-finite global scale");

  const int64_t G = K / kGroup;  // groups per row
  SgptqResult res;
  res.fallback = p.fallback;
  res.fallback_reason = p.reason;
  res.dead_columns = p.dead;
  res.patterns.assign(static_cast<size_t>(N * G), 0);
  if (fixed) {
    for (int64_t idx = 0; idx < N * G; ++idx)
      MOESQ_CHECK(fixed[idx] < kNumPatterns, "gptq: tensor ", name, " has pattern id ", int(fixed[idx]),
                  " at [", idx / G, ", ", idx % G, "] (expected 0..5)");
    std::copy(fixed, fixed + N * G, res.patterns.begin());
  }
  res.dense_rounded.assign(static_cast<size_t>(N * K), 0.0f);
  Codes codes;
  codes.scale.assign(static_cast<size_t>(N * (K / kSparseScaleBlock)), 0);
  codes.value.assign(static_cast<size_t>(N * K / 2), 0);

  double* Wt = p.Wt.data();
  const double* U = p.U.data();
  std::vector<float> block_dec(static_cast<size_t>(N));  // [N] dec(c) of the current scale block
  std::vector<double> err;                               // [block, N] (w − q)/d per column
  double loss = 0.0;
  for (int64_t b0 = 0; b0 < K; b0 += block) {
    const int64_t b1 = std::min(b0 + block, K);
    err.assign(static_cast<size_t>((b1 - b0) * N), 0.0);
    for (int64_t i = b0; i < b1; ++i) {
      if (i % kSparseScaleBlock == 0) {
        start_scale_block(Wt, U, N, K, i, gamma, fixed != nullptr, res, codes, block_dec);
      } else if (!fixed && opt.pattern_at_group && i % kGroup == 0) {
        // SparseGPT per-group choice on the updated weights; the block scale stays provisional.
        for (int64_t r = 0; r < N; ++r) res.patterns[r * G + i / kGroup] = choose_pattern(Wt, U, N, K, r, i);
      }
      double* ei = err.data() + (i - b0) * N;
      quantize_column(Wt + i * N, N, K, i, U[i * K + i], gamma, block_dec, res, codes, ei, loss);
      if (i < gptq_from) std::fill(ei, ei + N, 0.0);  // RTN column: no error propagated
      update_in_block(U, N, K, i, b1, ei, Wt, use_blas);
    }
    if (b1 < K) update_after_block(U, N, K, b0, b1, err, Wt, use_blas);
  }
  res.gptq_loss = loss;
  res.packed = sgptq_pack(N, K, gamma, res.patterns, std::move(codes.scale), codes.value);
  return res;
}

}  // namespace

void sgptq_check_weights(const float* W, int64_t N, int64_t K, const SgptqOptions& opt, const std::string& name) {
  MOESQ_CHECK(N > 0 && K > 0, "sgptq: tensor ", name, " has an empty shape [", N, ", ", K, "]");
  MOESQ_CHECK(K % kSparseScaleBlock == 0, "sgptq: tensor ", name, " has K=", K,
              ", not a multiple of ", kSparseScaleBlock, " (paired 4:8 NVFP4 scale block)");
  MOESQ_CHECK(opt.block_size > 0 && opt.block_size % kSparseScaleBlock == 0, "sgptq: block_size=",
              opt.block_size, " must be a positive multiple of ", kSparseScaleBlock);
  MOESQ_CHECK(opt.percdamp >= 0.0 && std::isfinite(opt.percdamp), "sgptq: percdamp=", opt.percdamp,
              " must be finite and >= 0");
  for (int64_t idx = 0; idx < N * K; ++idx)
    MOESQ_CHECK(std::isfinite(W[idx]), "sgptq: tensor ", name, " has a non-finite weight at [",
                idx / K, ", ", idx % K, "]");
}

format::Sparse48Tensor sgptq_pack(int64_t N, int64_t K, float gamma, const std::vector<uint8_t>& patterns,
                                  std::vector<uint8_t> scale_codes, const std::vector<uint8_t>& value_codes) {
  const int64_t G = K / kGroup;
  format::Sparse48Tensor t;
  t.N = N;
  t.K = K;
  t.global_scale = gamma;
  t.values.assign(static_cast<size_t>(N * K / 4), 0);
  t.meta.assign(static_cast<size_t>(N * K / 16), 0);
  t.scales = std::move(scale_codes);
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t kv = 0; kv < K / 2; ++kv) {
      const uint8_t code = value_codes[r * (K / 2) + kv] & 0xF;
      t.values[r * (K / 4) + kv / 2] |= (kv % 2 == 0) ? code : static_cast<uint8_t>(code << 4);
    }
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t nib = format::pattern_nibble(patterns[r * G + g]);
      t.meta[r * (K / 16) + g / 2] |= (g % 2 == 0) ? nib : static_cast<uint8_t>(nib << 4);
    }
  }
  return t;
}

SgptqResult sgptq(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                  const SgptqOptions& opt, const std::string& name) {
  return solve(W, N, K, H, global_scale, opt, name, opt.block_size, /*use_blas=*/true);
}

SgptqResult sgptq_ref(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                      const SgptqOptions& opt, const std::string& name) {
  return solve(W, N, K, H, global_scale, opt, name, K, /*use_blas=*/false);
}

SgptqResult gptq_fixed_support(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                               const uint8_t* patterns, int64_t gptq_from, const SgptqOptions& opt,
                               const std::string& name) {
  MOESQ_CHECK(gptq_from >= 0 && gptq_from <= K, "gptq: gptq_from=", gptq_from, " outside [0, K=", K, "]");
  return solve(W, N, K, H, global_scale, opt, name, opt.block_size, /*use_blas=*/true, patterns, gptq_from);
}

SgptqResult gptq_fixed_support_ref(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                                   const uint8_t* patterns, int64_t gptq_from, const SgptqOptions& opt,
                                   const std::string& name) {
  MOESQ_CHECK(gptq_from >= 0 && gptq_from <= K, "gptq: gptq_from=", gptq_from, " outside [0, K=", K, "]");
  return solve(W, N, K, H, global_scale, opt, name, K, /*use_blas=*/false, patterns, gptq_from);
}

}  // namespace moesq::compress

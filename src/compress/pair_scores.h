// Paired 4:8 support choice from a per-weight importance score, and the Wanda score both joint
// sparse-quantization baselines start from (JSQ: Guo et al. 2024, Eq. 2-4; OBR: Guo et al. 2026,
// its mask step). Non-obvious decision: a pair's score is the SUM of its two weights' scores, the
// N:M analogue of "prune the lowest-scoring weights" when the unit pruned is a pair (the paired 4:8
// format keeps whole pairs); the 2 highest-scoring pairs of every group of 8 are kept.
#pragma once
#include <cstdint>
#include <vector>

namespace moesq::compress {

// Per group of 8 along K (4 pairs), the pattern keeping the 2 pairs with the largest summed score.
// score: [N, K] (any finite values), K % 8 == 0. Ties → the lower pattern id (as
// format::magnitude_patterns). Returns [N, K/8] pattern ids in [0, 6). Error for K % 8 != 0 or a
// non-finite score (naming its row and column).
std::vector<uint8_t> patterns_from_scores(const double* score, int64_t N, int64_t K);

// Column L2 norms of the layer input over its n calibration rows: norm[j] = sqrt(Σ_t X[t,j]² / n)
// (Wanda's ‖X_j‖₂, with the running-mean normalisation of the JSQ/OBR reference code). X: [n, K]
// fp32; n == 0 → all zeros. Returns [K].
std::vector<double> input_column_norms(const float* X, int64_t n, int64_t K);

// Wanda score S[i, j] = |W[i, j]| · norm[j] (Sun et al. 2024, Eq. 1). W: [N, K]; norm: [K].
// Returns [N, K].
std::vector<double> wanda_scores(const float* W, int64_t N, int64_t K, const std::vector<double>& norm);

}  // namespace moesq::compress

// PyTorch-layout linear layers for the mixers: y [M, N] = x [M, K] · W [N, K]ᵀ (+ b [N]).
// `linear` is one OpenBLAS sgemm; `linear_ref` its plain-loop twin (fp32 accumulation in k order).
#pragma once
#include <cstdint>
#include <vector>

namespace moesq::model {

// bias: empty = none. x, W, y must not alias.
void linear(const float* x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N, float* y,
            const std::vector<float>& bias = {});
void linear_ref(const float* x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N, float* y,
                const std::vector<float>& bias = {});

}  // namespace moesq::model

// Small row operations shared by the full forward (decoder.cpp, mixers/, router.cpp) and the
// KV-cached decoder (kv_decoder.cpp), so all compute linears, RMSNorm and the next-token NLL with the
// same arithmetic as transformers (RoPE is model/rope.h).
#pragma once
#include <cstdint>
#include <vector>

namespace moesq::model {

// y [M, N] = x [M, K] · W [N, K]ᵀ  (PyTorch Linear, no bias): OpenBLAS sgemm.
void linear(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y);
// Plain-loop twin of linear (fp32 accumulation in k order).
void linear_ref(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y);

// threads 0 → moesq::num_threads() (ForwardOptions::threads).
int intra_threads(int threads);

// RMSNorm of n rows of width D (Qwen3RMSNorm): y = w · x / sqrt(mean(x²) + eps). x, y: [n, D].
void rmsnorm_rows(const float* x, int64_t n, int64_t D, const float* w, double eps, float* y);

// y [n, N] += b [N] on every row (attention_bias); an empty b (no bias) does nothing.
void add_bias_rows(float* y, int64_t n, int64_t N, const std::vector<float>& b);

// Mean next-token NLL (nats) of one window: mean over t < T−1 of −log softmax(logits[t])[tokens[t+1]],
// logits [T, V]; log-sum-exp in double. Shared by every model's window_nll.
double next_token_nll(const float* logits, const std::vector<int32_t>& tokens, int64_t V);

}  // namespace moesq::model

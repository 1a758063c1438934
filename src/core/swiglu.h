// SiLU and the SwiGLU product silu(g) · u: the one CPU definition (the model's experts and dense
// MLPs, and the refinement objective's forward, include this). The fp32 order is fixed here
// because compressed bytes depend on it: silu(g) = g / (1 + e^-g), then · u.
#pragma once
#include <algorithm>
#include <cmath>

namespace moesq {

template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <typename T>
inline T silu(T x) {
  return x / (T(1) + std::exp(-x));
}

// h = silu(g) ⊙ u, one element (SwiGLU).
template <typename T>
inline T silu_mul(T g, T u) {
  return silu(g) * u;
}

// The same product from a σ(g) the caller already holds (the refinement backward reuses σ for
// silu'(g) = σ(1 + g(1 − σ))): g · σ · u. Not bit-identical to silu_mul (g·(1/x) vs g/x): the
// refinement's forward has always used this order, and changing it would change moesq's bytes.
template <typename T>
inline T silu_mul_with_sigmoid(T g, T sigmoid_g, T u) {
  return g * sigmoid_g * u;
}

// gpt-oss's clamped SwiGLU (transformers GptOssExperts, its fp32 order): g ← min(g, limit),
// u ← clamp(u, −limit, limit), h = (u + 1) · (g · σ(alpha · g)).
template <typename T>
inline T clamped_swiglu(T g, T u, T alpha, T limit) {
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return (u + T(1)) * (g * sigmoid(g * alpha));
}

// Its partial derivatives ∂h/∂g, ∂h/∂u at the pre-clamp (g, u): zero where the clamp is active
// (torch.clamp passes the gradient on the closed interval).
template <typename T>
inline void clamped_swiglu_grad(T g, T u, T alpha, T limit, T* dg, T* du) {
  const bool g_in = g <= limit, u_in = u >= -limit && u <= limit;
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  const T s = sigmoid(g * alpha), glu = g * s;
  *dg = g_in ? (u + T(1)) * (s + g * alpha * s * (T(1) - s)) : T(0);
  *du = u_in ? glu : T(0);
}

}  // namespace moesq

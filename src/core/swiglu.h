// SiLU and the SwiGLU product silu(g) · u: the one CPU definition (the model's experts and dense
// MLPs, and the refinement objective's forward, include this). The fp32 order is fixed here
// because compressed bytes depend on it: silu(g) = g / (1 + e^-g), then · u.
#pragma once
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

}  // namespace moesq

// SGPTQ of one expert on the GPU (`compress --device cuda`; SgptqOptions::device): the same
// algorithm as the CPU solver (compress/sgptq.h, methods/sgptq_expert.h) with every O(K³) and
// O(n·K²) stage on the device, on the calling thread's own stream:
//   * Hessians H = 2 XᵀX / n in fp64: the rows widened (ops/widen_f64) and cuBLAS DSYRK per chunk;
//     gate and up share one Hessian and one factor (the CPU solver factors it per projection);
//   * damping and dead inputs on H's diagonal (read back, decided on the host as the CPU does);
//   * U = the upper Cholesky factor of H⁻¹ by the CPU's index reversal: chol(J H J) (cuSOLVER
//     potrf), its triangular inverse (cuSOLVER trtri), reversed back (thrust); the same pivot test;
//   * the column loop: per lazy block, ops/sgptq_columns (one thread per row), then cuBLAS DGEMM
//     applies the block's error to the later columns;
//   * down's Hessian on ITS inputs through the compressed gate/up (a 3xTF32 GEMM, fp32-class accuracy:
//     gpu::sgemm_3xtf32, + SwiGLU, no Q_a).
// The result is a CPU solve's up to fp64 summation order (GEMM and factorisation order), so it is
// not bit-equal to `--device cpu`; two GPU runs are (fixed launch configurations, no atomics).
// Non-obvious: a non-finite Hessian is detected on its diagonal only (x² of a NaN or an infinity
// lands there; off-diagonal entries are bounded by √(H_ii·H_jj)).
// Defined in CUDA builds only (moesq_compress_cuda).
#pragma once
#include "compress/methods/sgptq_expert.h"

namespace moesq::compress {

// Errors (moesq::Error): no CUDA device, an expert with biases or the clamped SwiGLU (gpt-oss: run
// it with --device cpu), the CPU solver's input errors (sgptq_check_weights), a CUDA/cuBLAS/cuSOLVER
// failure naming the call. Fallbacks (no / too few tokens, a non-finite or not positive definite
// Hessian) as the CPU solver's, in rep.
SgptqExpert sgptq_expert_cuda(const ExpertJob& job, const SgptqOptions& opt, ExpertReport& rep);

}  // namespace moesq::compress

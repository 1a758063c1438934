// The CUDA step backend of the moesq refinement (refine/step_backend.h): one expert's rows,
// parameters and Lion momenta in GPU memory, every step as kernels (src/ops/gumbel_support,
// fake_quant, swiglu_train, weighted_mse, gather_f32) and five cuBLAS fp32 GEMMs on the calling
// thread's own stream, so the experts a compress run refines on its threads overlap on the GPU.
// Defined only in CUDA builds (moesq_compress_cuda); `compress --device cuda` sets
// RefineOptions::device to it.
//
// Non-obvious decisions:
//  * The GEMMs run in fp32 (cuBLAS pedantic math: no TF32) like the CPU's cblas_sgemm unless asked
//    (RefineOptions::tf32_backward: the three gradient GEMMs on TF32, what `compress --device cuda`
//    sets by default; RefineOptions::tf32_gemm: all five; both measured in bench/NOTES.md), so a GPU
//    run follows the CPU run's trajectory up to summation order and the gradients' TF32 rounding; the
//    kernels draw the same counter-based noise (ops/gumbel_support/gumbel_math.h). A GPU run is bitwise
//    reproducible on one GPU model.
//  * A training step needs no host synchronization: the epoch's row order is uploaded once, the step's
//    scalars are kernel arguments. The host waits only for the per-epoch curves.
//  * A non-finite weight or activation (a diverged refinement) raises a device flag that the next
//    eval_loss / sync turns into an Error (the CPU path throws at the first such value).
#pragma once
#include <memory>

#include "compress/refine/step_backend.h"

namespace moesq::compress::refine {

// Errors (moesq::Error, when a step is started): no CUDA device, gpt-oss's expert variant (biased,
// clamped SwiGLU: run it with --device cpu), an activation block other than 16 or 32.
std::unique_ptr<StepBackend> make_cuda_step_backend();

// A profile of the training steps run on the calling thread (bench_refine_layer --profile): GPU
// seconds per stage, from CUDA events around each stage. Off by default; while on, every stage waits
// for its events, so it measures each stage alone (no overlap between the experts' streams).
struct StageTimes {
  double support = 0, weight_quant = 0, gather = 0, gemm = 0, swiglu = 0, loss = 0, lion = 0;
  int64_t steps = 0;
};
void set_stage_timing(bool on);  // for the calling thread; resets its StageTimes
StageTimes stage_times();        // the calling thread's

}  // namespace moesq::compress::refine

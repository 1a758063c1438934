// `moesq eval --device cuda`: the CPU eval's windows and reductions (model/eval.h) with the logits
// from the GPU engine; windows run as batched prefills of up to `batch` sequences. Same EvalResult,
// so the CLI prints the same JSON. Implemented in engine_eval.cu (needs the CUDA build).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "model/eval.h"
#include "runtime/backend.h"
#include "runtime/engine.h"

namespace moesq::runtime {

struct CudaEvalOptions {
  model::EvalOptions eval;                        // seq_len, split, act_quant (threads unused)
  ExpertBackend experts = ExpertBackend::kAuto;   // act_quant none + auto on paired 4:8 → sparse-w4a16
  int batch = 8;                                  // windows per prefill
  bool deterministic = true;                      // EngineOptions::deterministic (batch-invariant logits)
  bool check_finite = false;                      // EngineOptions::check_finite (stop at the first NaN / inf)
  // Called with the checkpoint's spec before anything is loaded: `mpirun` ranks set their GPU, expert
  // shard (the host then reads only those experts) and exchange there (cli/expert_parallel.h). Empty:
  // one GPU, every expert.
  std::function<void(const io::ModelSpec&, EngineOptions&)> engine_options;
};

model::EvalResult evaluate_checkpoint_cuda(const std::string& dir, const std::vector<std::string>& files,
                                           const CudaEvalOptions& opt, std::string* backend_used = nullptr);

}  // namespace moesq::runtime

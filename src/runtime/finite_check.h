// The GPU engine's debug check for non-finite activations (EngineOptions::check_finite, the CLI's
// --check-finite). Off (the default) it costs nothing: no launch, no copy, no sync. On, after each
// stage of each layer an ops::finite_check folds the first NaN / ±inf into one 8-byte device record;
// the engine copies the record back beside the logits (the sync the forward already has) and throws
// NonFiniteError, which names the layer, the stage, the expert and the token.
// This file is the host half, CPU code tested without a GPU: the numbering of the check sites in
// forward order (the record keeps the smallest site, so the error names where the values first went
// bad, not where the NaN spread to) and the error a record becomes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/finite_check/finite_check.h"

namespace moesq::runtime {

// What a check site looks at, in forward order within a layer.
enum class FiniteStage : uint32_t {
  kEmbedding = 0,     // the embedding rows (layer −1: before the first layer)
  kAttention = 1,     // the residual stream after the attention block (h += o_proj(attention))
  kRouterLogits = 2,  // [T, E] fp32 router logits
  kExpertGateUp = 3,  // per expert: the gate|up GEMM output of its routed rows [E, T, 2I] fp32
  kExpertOutput = 4,  // per expert: the down GEMM output of its routed rows [E, T, H] bf16
  kMoeOutput = 5,     // the residual stream after the MoE block (h += combine)
  kLogits = 6,        // the lm_head logits of the output rows (layer = num_layers: after the last layer)
};
constexpr uint32_t kFiniteSitesPerLayer = 8;
// The largest layer count the sites number: (L + 2) · 8 ≤ ops::kFiniteMaxSite + 1.
constexpr int64_t kFiniteMaxLayers = (ops::kFiniteMaxSite + 1) / kFiniteSitesPerLayer - 2;

// site = (layer + 1) · 8 + stage: layer −1 (embedding) … num_layers (logits). Errors: a layer outside
// [−1, kFiniteMaxLayers].
uint32_t finite_site(int64_t layer, FiniteStage stage);
struct FiniteSite {
  int64_t layer = 0;  // −1: the embedding; num_layers: the logits
  FiniteStage stage = FiniteStage::kEmbedding;
};
FiniteSite finite_site_of(uint32_t site);
bool finite_stage_per_expert(FiniteStage stage);  // the record's group is the expert id

// Where a forward's rows come from, to name a token in the error: the slot and position of every
// token (the forward's order) and the token index of each logits row.
struct FiniteRows {
  std::vector<int32_t> slot, pos;  // [T]
  std::vector<int32_t> out_rows;   // [n_out]
};

// The first non-finite activation of a GPU forward (a moesq::Error: the CLI prints it and exits 1).
// Message: "GPU forward: NaN in layer 3/4, expert 17 output (down projection) at token 5 of the batch
// (slot 0, position 5), the first non-finite activation of this forward (--check-finite); ..." and
// what to look at.
class NonFiniteError : public Error {
 public:
  NonFiniteError(const ops::FiniteFinding& f, int64_t num_layers, const FiniteRows& rows);
  int64_t layer = 0;        // 0-based; −1: the embedding; num_layers: the logits
  FiniteStage stage = FiniteStage::kEmbedding;
  int64_t expert = -1;      // per-expert stages; −1 otherwise
  int64_t token = -1;       // index in the forward's tokens; −1 when the rows do not say
  int64_t row = 0;          // the record's row (logits: the output row)
  int32_t slot = -1;        // of that token; −1 when unknown
  int64_t position = -1;
  ops::FiniteKind kind = ops::FiniteKind::kNan;
};

// The message of NonFiniteError (also for tests).
std::string non_finite_message(const ops::FiniteFinding& f, int64_t num_layers, const FiniteRows& rows);

}  // namespace moesq::runtime

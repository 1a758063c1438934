// Host half of the engine's non-finite check (finite_check.h): site numbers and the error message.
#include "runtime/finite_check.h"

#include <algorithm>
#include <sstream>

#include "core/progress.h"

namespace moesq::runtime {

uint32_t finite_site(int64_t layer, FiniteStage stage) {
  MOESQ_CHECK(layer >= -1 && layer <= kFiniteMaxLayers, "--check-finite: layer index ", layer, " outside [-1, ",
              kFiniteMaxLayers, "] (the check numbers at most ", kFiniteMaxLayers, " layers)");
  return static_cast<uint32_t>((layer + 1) * kFiniteSitesPerLayer + static_cast<uint32_t>(stage));
}

FiniteSite finite_site_of(uint32_t site) {
  FiniteSite s;
  s.layer = static_cast<int64_t>(site / kFiniteSitesPerLayer) - 1;
  s.stage = static_cast<FiniteStage>(site % kFiniteSitesPerLayer);
  return s;
}

bool finite_stage_per_expert(FiniteStage stage) {
  return stage == FiniteStage::kExpertGateUp || stage == FiniteStage::kExpertOutput;
}

namespace {

// Everything the error says, decoded once (the message and NonFiniteError's fields).
struct Described {
  FiniteSite site;
  int64_t expert = -1, token = -1, row = 0, position = -1;
  int32_t slot = -1;
  ops::FiniteKind kind = ops::FiniteKind::kNan;
  std::string message;
};

Described describe(const ops::FiniteFinding& f, int64_t num_layers, const FiniteRows& rows) {
  Described d;
  d.site = finite_site_of(f.site);
  d.kind = f.kind;
  d.row = f.row;
  if (finite_stage_per_expert(d.site.stage)) d.expert = f.group;
  // The token of the record's row: the row itself, or for the logits the token of that output row.
  if (d.site.stage != FiniteStage::kLogits)
    d.token = f.row;
  else if (f.row < static_cast<int64_t>(rows.out_rows.size()))
    d.token = rows.out_rows[f.row];
  const int64_t known = static_cast<int64_t>(std::min(rows.slot.size(), rows.pos.size()));
  if (d.token >= 0 && d.token < known)
    d.slot = rows.slot[d.token], d.position = rows.pos[d.token];

  const std::string layer = layer_label(d.site.layer, num_layers);
  const std::string expert = "expert " + std::to_string(d.expert);
  std::string where, look;
  switch (d.site.stage) {
    case FiniteStage::kEmbedding:
      where = "the embedding output";
      look = "the embedding row of that token id (model.embed_tokens)";
      break;
    case FiniteStage::kAttention:
      where = layer + " attention output (the residual stream after o_proj)";
      look = layer + "'s attention weights (input norm, q|k|v, q/k norms, o_proj) or an overflow there";
      break;
    case FiniteStage::kRouterLogits:
      where = layer + " router logits";
      look = layer + "'s post-attention norm and router weights";
      break;
    case FiniteStage::kExpertGateUp:
      where = layer + ", " + expert + " gate|up output";
      look = layer + " " + expert + "'s gate and up weights and scales, or an overflow of its gate|up GEMM";
      break;
    case FiniteStage::kExpertOutput:
      where = layer + ", " + expert + " output (down projection)";
      look = layer + " " + expert + "'s down weights and scales, or an overflow of its SwiGLU or down GEMM";
      break;
    case FiniteStage::kMoeOutput:
      where = layer + " MoE output (the residual stream after the combine)";
      look = layer + "'s combine (router weights times expert outputs) or an overflow of the residual stream";
      break;
    case FiniteStage::kLogits:
      where = "the logits (final norm + lm_head)";
      look = "the final norm and lm_head weights";
      break;
    default:
      where = "check site " + std::to_string(f.site);
      look = "the engine's check sites";
  }
  std::ostringstream os;
  os << "GPU forward: " << ops::finite_kind_name(d.kind) << " in " << where;
  if (d.token >= 0) {
    os << " at token " << d.token << " of the batch";
    if (d.slot >= 0) os << " (slot " << d.slot << ", position " << d.position << ")";
  } else {
    os << " at logits row " << d.row;
  }
  os << ", the first non-finite activation of this forward (--check-finite). Look at " << look
     << "; run the same input with --device cpu (the reference forward, which refuses non-finite weights at "
        "load) to see whether the checkpoint or the GPU path is at fault";
  if (finite_stage_per_expert(d.site.stage)) os << ", and with --experts bf16 to rule the packed format in or out";
  d.message = os.str();
  return d;
}

}  // namespace

std::string non_finite_message(const ops::FiniteFinding& f, int64_t num_layers, const FiniteRows& rows) {
  return describe(f, num_layers, rows).message;
}

NonFiniteError::NonFiniteError(const ops::FiniteFinding& f, int64_t num_layers, const FiniteRows& rows)
    : Error(non_finite_message(f, num_layers, rows)) {
  const Described d = describe(f, num_layers, rows);
  layer = d.site.layer, stage = d.site.stage, expert = d.expert, token = d.token, row = d.row;
  slot = d.slot, position = d.position, kind = d.kind;
}

}  // namespace moesq::runtime

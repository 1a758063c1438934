// RefineOptions: the range checks (once, before any work), the held-out split and the report's JSON mapping.
#include "compress/refine/options.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"

namespace moesq::compress {

void validate(const RefineOptions& o) {
  MOESQ_CHECK(o.p >= 0, "refine: --objective weight power p=", o.p, " must be >= 0");
  MOESQ_CHECK(o.epochs >= 0, "refine: --epochs=", o.epochs, " must be >= 0");
  MOESQ_CHECK(o.batch > 0 && o.micro_batch > 0, "refine: batch=", o.batch, " and micro-batch=",
              o.micro_batch, " must be positive");
  MOESQ_CHECK(o.lr_A >= 0 && o.lr_V >= 0 && o.lr_final_frac >= 0, "refine: learning rates lr_A=",
              o.lr_A, " lr_V=", o.lr_V, " final fraction=", o.lr_final_frac, " must be >= 0");
  MOESQ_CHECK(o.tau0 > 0 && o.tau1 > 0, "refine: temperatures τ0=", o.tau0, " τ1=", o.tau1,
              " must be positive");
  MOESQ_CHECK(o.heldout_fraction >= 0 && o.heldout_fraction < 1,
              "refine: held-out fraction ", o.heldout_fraction, " must be in [0, 1)");
  MOESQ_CHECK(o.act_block > 0, "refine: activation block ", o.act_block, " must be positive");
  MOESQ_CHECK(o.step_sequences >= 0, "refine: --step-sequences=", o.step_sequences, " must be >= 0 (0 = per-expert batches)");
  MOESQ_CHECK(o.rule_lr_A_scale > 0 && std::isfinite(o.rule_lr_A_scale) && o.rule_lr_V_scale > 0 &&
                  std::isfinite(o.rule_lr_V_scale),
              "refine: --lr-a-scale=", o.rule_lr_A_scale, " and --lr-v-scale=", o.rule_lr_V_scale, " must be positive");
  MOESQ_CHECK(o.min_rows >= 0, "refine: min_rows=", o.min_rows, " must be >= 0");
  MOESQ_CHECK(o.scale_finetune_epochs >= 0 && o.scale_finetune_lr >= 0 && std::isfinite(o.scale_finetune_lr),
              "refine: --scale-finetune-epochs=", o.scale_finetune_epochs, " and --scale-finetune-lr=",
              o.scale_finetune_lr, " must be >= 0");
  MOESQ_CHECK(o.scale_finetune_epochs == 0 || !o.device, "--scale-finetune-epochs: the scale fine-tuning runs on the "
              "CPU only for now; add --device cpu");
  MOESQ_CHECK(!o.original_targets || !o.device, "--targets original: the original model's calibration stream runs "
              "on the CPU only for now; add --device cpu");
}

int64_t heldout_rows(const RefineOptions& o, int64_t n) {
  const auto held = static_cast<int64_t>(std::floor(o.heldout_fraction * static_cast<double>(n)));
  return std::min<int64_t>(held, std::max<int64_t>(n - 1, 0));
}

namespace {

// Every option with its JSON key, once: both directions of the JSON mapping walk this list.
template <typename Fn>
void for_each_option(RefineOptions& o, Fn&& fn) {
  fn("p", o.p);
  fn("update_A", o.update_A);
  fn("epochs", o.epochs);
  fn("batch", o.batch);
  fn("micro_batch", o.micro_batch);
  fn("lr_A", o.lr_A);
  fn("lr_V", o.lr_V);
  fn("beta1", o.beta1);
  fn("beta2", o.beta2);
  fn("weight_decay", o.weight_decay);
  fn("lr_final_frac", o.lr_final_frac);
  fn("tau0", o.tau0);
  fn("tau1", o.tau1);
  fn("kappa0", o.kappa0);
  fn("kappa1", o.kappa1);
  fn("sigma", o.sigma);
  fn("s", o.s);
  fn("heldout_fraction", o.heldout_fraction);
  fn("seed", o.seed);
  fn("act_block", o.act_block);
  fn("keep_init_if_worse", o.keep_init_if_worse);
  fn("restore_best", o.restore_best);
  fn("min_rows", o.min_rows);
  fn("rule_batch", o.rule_batch);
  fn("rule_epochs", o.rule_epochs);
  fn("rule_lr_A", o.rule_lr_A);
  fn("rule_lr_V", o.rule_lr_V);
  fn("rule_per_expert", o.rule_per_expert);
  fn("tf32_gemm", o.tf32_gemm);
  fn("tf32_backward", o.tf32_backward);
  fn("bf16_forward", o.bf16_forward);
  fn("step_sequences", o.step_sequences);
  fn("scale_finetune_epochs", o.scale_finetune_epochs);
  fn("scale_finetune_lr", o.scale_finetune_lr);
  fn("original_targets", o.original_targets);
  fn("rule_lr_A_scale", o.rule_lr_A_scale);
  fn("rule_lr_V_scale", o.rule_lr_V_scale);
}

}  // namespace

const char* const kGpuGemmModes[4] = {"fp32", "tf32", "tf32-backward", "bf16-forward"};

void set_gpu_gemm(RefineOptions& o, const std::string& mode, const char* flag) {
  MOESQ_CHECK(mode == "fp32" || mode == "tf32" || mode == "tf32-backward" || mode == "bf16-forward", flag, ": '",
              mode, "' is not one of fp32, tf32, tf32-backward, bf16-forward");
  o.tf32_gemm = mode == "tf32";
  o.tf32_backward = mode == "tf32-backward" || mode == "bf16-forward";
  o.bf16_forward = mode == "bf16-forward";
}

RefineOptions refine_options_from_json(const nlohmann::json& j) {
  MOESQ_CHECK(j.is_null() || j.is_object(), "refine options: expected a JSON object, got ", j.dump());
  RefineOptions o;
  if (j.is_null()) return o;
  size_t known = 0;
  for_each_option(o, [&](const char* key, auto& field) {
    if (!j.contains(key)) return;
    ++known;
    try {
      field = j.at(key).get<std::remove_reference_t<decltype(field)>>();
    } catch (const nlohmann::json::exception& e) {
      MOESQ_FAIL("refine options: key '", key, "' has a wrong value ", j.at(key).dump(), " (",
                 e.what(), ")");
    }
  });
  if (known != j.size()) {
    RefineOptions probe;
    for (const auto& [key, value] : j.items()) {
      bool found = false;
      for_each_option(probe, [&](const char* k, auto&) { found = found || key == k; });
      MOESQ_CHECK(found, "refine options: unknown key '", key, "'");
    }
  }
  return o;
}

nlohmann::json refine_options_to_json(const RefineOptions& o) {
  nlohmann::json j = nlohmann::json::object();
  RefineOptions copy = o;
  for_each_option(copy, [&](const char* key, auto& field) { j[key] = field; });
  // Written only when set: the options of every earlier run (all fp32) keep their bytes, so their
  // resume manifests still match (tests/compress/test_method_table.cpp).
  if (!o.tf32_gemm) j.erase("tf32_gemm");
  if (!o.tf32_backward) j.erase("tf32_backward");
  if (!o.bf16_forward) j.erase("bf16_forward");
  if (o.step_sequences == 0) j.erase("step_sequences");
  if (o.scale_finetune_epochs == 0) j.erase("scale_finetune_epochs"), j.erase("scale_finetune_lr");
  if (!o.original_targets) j.erase("original_targets");
  if (o.rule_lr_A_scale == 1.0) j.erase("rule_lr_A_scale");
  if (o.rule_lr_V_scale == 1.0) j.erase("rule_lr_V_scale");
  return j;
}

}  // namespace moesq::compress

#include "cli/compress_flags.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace moesq::cli {

namespace {
// CLI11's PositiveNumber prints DBL_MAX in its message; these say what is wanted.
const CLI::Validator kPositive(
    [](std::string& s) -> std::string {
      try {
        return std::stod(s) > 0 ? "" : "must be > 0 (got " + s + ")";
      } catch (...) {
        return "must be a number > 0 (got " + s + ")";
      }
    },
    "> 0");
const CLI::Validator kNonNegative(
    [](std::string& s) -> std::string {
      try {
        const double v = std::stod(s);  // "1e-4" is fine: only the value's sign matters
        return v >= 0 && !std::signbit(v) ? "" : "must be >= 0 (got " + s + ")";
      } catch (...) {
        return "must be a number >= 0 (got " + s + ")";
      }
    },
    ">= 0");
}  // namespace

void add_compress_flags(CLI::App* cmd, CompressFlags& f, bool with_calib_files) {
  if (with_calib_files) {
    cmd->add_option("--calib", f.calib, "calibration data: text files (through the checkpoint's tokenizer.json; bytes for a byte-level\n"
                    "model) or token-id .npy (int32/uint32)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--calib-split", f.calib_split,
                    "part of each calibration text file to use: all | train (first 98 %) | heldout (last 2 %)")
        ->check(CLI::IsMember({"all", "train", "heldout"}));
    cmd->add_option("--calib-sampled", f.calib_sampled,
                    "with --calib: N more sequences of --seq-len sampled from the model itself (as data-free\n"
                    "calibration does) added to the files' --calib-samples, a mixed calibration. 0 = none")
        ->check(kNonNegative)
        ->capture_default_str();
  }
  cmd->add_option("--calib-samples", f.calib_samples,
                  "number of calibration sequences (fewer available in the --calib files: a WARNING, an error with --strict)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_flag("--strict", f.strict, "treat calibration warnings (fewer sequences than --calib-samples) as errors");
  cmd->add_option("--seq-len", f.seq_len, "calibration sequence length in tokens")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--seed", f.opt.refine.seed, "seed for data-free sampling and refinement noise")->check(kNonNegative);
  cmd->add_option("--threads", f.opt.threads, "worker threads (default: all cores)")->check(kNonNegative);
  cmd->add_option("--percdamp", f.opt.sgptq.percdamp, "SGPTQ Hessian damping, fraction of mean(diag H)")
      ->check(CLI::Range(0.0, 10.0));
  compress::RefineOptions& r = f.opt.refine;
  f.objective = r.p == 0 ? "uniform" : "router";
  f.update = r.update_A ? "AV" : "V";
  f.schedule_scope = r.rule_per_expert ? "expert" : "layer";
  f.select_epoch = r.restore_best ? "best" : "last";
  f.targets = r.original_targets ? "original" : "compressed";
  auto* g = cmd->add_option_group("refinement (--method moesq)");
  f.refine_group = g;
  g->add_option("--objective", f.objective, "router (p = 2, Eq. 4) | uniform (p = 0 ablation)")
      ->check(CLI::IsMember({"router", "uniform"}));
  g->add_option("--update", f.update, "AV (supports and values) | V (values only; SGPTQ support kept)")
      ->check(CLI::IsMember({"AV", "V"}));
  const std::string by_rule = " (not given: set per expert by the schedule rule, docs/RESULTS.md; shown: Table-4 value)";
  f.epochs_opt = g->add_option("--epochs", r.epochs, "refinement epochs over the cached tokens" + by_rule)
                     ->check(CLI::Range(0, 100000));
  f.lr_a_opt = g->add_option("--lr-a", r.lr_A, "Lion learning rate of the pattern logits A" + by_rule)->check(kNonNegative);
  f.lr_v_opt = g->add_option("--lr-v", r.lr_V, "Lion learning rate of the latent weights V" + by_rule)->check(kNonNegative);
  g->add_option("--lr-a-scale", r.rule_lr_A_scale, "multiplier of the rule's lr_A (not of an explicit --lr-a)")
      ->check(kPositive)
      ->capture_default_str();
  g->add_option("--lr-v-scale", r.rule_lr_V_scale, "multiplier of the rule's lr_V (not of an explicit --lr-v)")
      ->check(kPositive)
      ->capture_default_str();
  g->add_option("--schedule-scope", f.schedule_scope,
                "rows the schedule rule uses: expert (each expert's own) | layer (the layer's mean per expert)")
      ->check(CLI::IsMember({"expert", "layer"}));
  g->add_option("--select-epoch", f.select_epoch,
                "state packed per expert: last (after the final epoch, paper) | best (lowest held-out Eq. 4 loss\n"
                "among the SGPTQ start and every epoch's end: early stopping on the 10 % held-out rows)")
      ->check(CLI::IsMember({"last", "best"}));
  g->add_option("--targets", f.targets,
                "the refinement's targets: compressed (the original expert on its rows of the compressed model's\n"
                "states, paper Algorithm 1) | original (the original expert on the same tokens' rows of the\n"
                "ORIGINAL model's states, run beside: the expert also learns to undo earlier layers' drift;\n"
                "measured 7 points of the SGPTQ gap WORSE on the fixture, docs/RESULTS.md). CPU only (--device cpu)")
      ->check(CLI::IsMember({"compressed", "original"}));
  g->add_option("--tau0", r.tau0, "Gumbel-softmax temperature at the first step")->check(kPositive);
  g->add_option("--tau1", r.tau1, "temperature at the last step")->check(kPositive);
  g->add_option("--kappa0", r.kappa0, "logit scale κ at the first step")->check(kPositive);
  g->add_option("--kappa1", r.kappa1, "logit scale κ at the last step")->check(kPositive);
  f.batch_opt = g->add_option("--batch", r.batch, "tokens per optimizer step" + by_rule)->check(kPositive);
  g->add_option("--micro-batch", r.micro_batch, "tokens per gradient micro-batch")->check(kPositive);
  g->add_option("--step-sequences", r.step_sequences,
                    "0: per-expert batches of --batch rows (default) | N: the LAYER-WIDE schedule of the paper's\n"
                    "reference: each Lion step takes N calibration sequences, the same for every expert of the layer,\n"
                    "and each expert steps on its rows from them (epochs and rates by the rule for that step count).\n"
                    "Measured (docs/RESULTS.md): 64 with --gpu-gemm tf32 compresses a Qwen3-30B-A3B layer in 11.2 s\n"
                    "on an H200 instead of 23.3 s, closing ~2 points less of the SGPTQ gap on the fixture")
      ->check(kNonNegative);
  g->add_option("--scale-finetune-epochs", r.scale_finetune_epochs,
                "after the refinement, epochs of scale-only fine-tuning (the paper reference's GSQ stage): every E2M1\n"
                "value and pattern frozen, one Lion-trained log-multiplier per UE4M3 block scale, projected onto\n"
                "what NVFP4 stores in the forward; kept per expert only where the held-out loss goes down\n"
                "(report.json scale_finetune). 0 = off. CPU only for now (--device cpu)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  g->add_option("--scale-finetune-lr", r.scale_finetune_lr,
                "Lion rate of the scale log-multipliers (1e-3: a block scale moves 0.1 % per step)")
      ->check(kNonNegative)
      ->capture_default_str();
  g->add_option("--gpu-gemm", f.gpu_gemm,
                "precision of the refinement's GEMMs on the GPU (bench/NOTES.md \"GPU compression v5\"):\n"
                "bf16-forward (the default: the two forward GEMMs on bf16 tensor cores over the unscaled NVFP4\n"
                "operands, which bf16 holds exactly, so every product is exact and the sums fp32; the three\n"
                "gradient GEMMs on TF32; a Qwen3-30B-A3B layer in 14.1 s on an H200, the fixture's held-out nats\n"
                "within seed noise of tf32-backward's) | tf32-backward (forward GEMMs fp32, gradients TF32; 19.2 s)\n"
                "| fp32 (as the CPU) | tf32 (all five on TF32: 10-bit mantissa inputs; ~1 point less of the SGPTQ\n"
                "gap closed)")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(compress::kGpuGemmModes),
                                                     std::end(compress::kGpuGemmModes))));
  auto* b = cmd->add_option_group("baselines (--method jsq | obr)");
  f.baseline_group = b;
  b->add_option("--jsq-rho", f.opt.jsq.rho, "JSQ: weight of the quantization-range salience ss against |W|·‖X‖ (compress/jsq.h)")
      ->check(kNonNegative);
  b->add_option("--obr-alpha", f.opt.obr.alpha,
                "OBR: fraction of the columns rounded first; the rest absorbs their error, then GPTQ")
      ->check(CLI::Range(0.0, 1.0));
}

void CompressFlags::check_flags_apply(const compress::Method& m) const {
  if (refine_group && !m.refines)
    for (const CLI::Option* o : refine_group->get_options())
      MOESQ_CHECK(o->count() == 0, o->get_name(), " applies to --method moesq (the refinement); --method ", m.name,
                  " does not refine, so it would be ignored");
  if (baseline_group)
    for (const CLI::Option* o : baseline_group->get_options()) {
      const std::string n = o->get_name();  // --jsq-* belongs to jsq, --obr-* to obr
      const std::string owner = n.rfind("--jsq", 0) == 0 ? "jsq" : n.rfind("--obr", 0) == 0 ? "obr" : m.name;
      MOESQ_CHECK(o->count() == 0 || owner == m.name, n, " applies to --method ", owner, "; --method ", m.name,
                  " would ignore it");
    }
}

compress::CompressOptions CompressFlags::options(const std::string& method) const {
  compress::CompressOptions o = opt;
  o.method = compress::parse_method(method);
  compress::RefineOptions& r = o.refine;
  r.p = objective == "router" ? 2 : 0;
  r.update_A = update == "AV";
  auto by_rule = [this](const CLI::Option* flag) { return !schedule_preset && !(flag && flag->count() > 0); };
  r.rule_epochs = by_rule(epochs_opt);
  r.rule_batch = by_rule(batch_opt);
  r.rule_lr_A = by_rule(lr_a_opt);
  r.rule_lr_V = by_rule(lr_v_opt);
  r.rule_per_expert = schedule_scope == "expert";
  r.restore_best = select_epoch == "best";
  r.original_targets = targets == "original";
  if (!gpu_gemm.empty()) compress::set_gpu_gemm(r, gpu_gemm);
  MOESQ_CHECK(r.step_sequences == 0 || !(batch_opt && batch_opt->count() > 0),
              "--batch applies to the per-expert schedule; --step-sequences ", r.step_sequences,
              " chooses the layer-wide one, whose steps take whole sequences");
  compress::validate(o);  // once, at the boundary: a bad value fails before the model is loaded
  return o;
}

std::string method_help() {
  constexpr size_t kWidth = 96;  // characters per help line (CLI11 indents them)
  std::string s, line;
  for (const compress::Method* m : compress::all_methods()) {
    const std::string item = std::string(m->name) + " (" + m->help + ")";
    if (!line.empty() && line.size() + 3 + item.size() > kWidth) {
      s += line + " |\n";
      line.clear();
    }
    line += (line.empty() ? "" : " | ") + item;
  }
  return s + line;
}

compress::CalibSet CompressFlags::calibration(const model::DecoderModel& m, const std::string& dir) const {
  m.spec().check_seq_len(seq_len, "--seq-len");
  MOESQ_CHECK(calib_sampled == 0 || !calib.empty(), "--calib-sampled ", calib_sampled,
              " adds sampled sequences to --calib files; without --calib the calibration is all sampled: set "
              "--calib-samples");
  if (calib.empty()) return compress::calib_from_model(m, calib_samples, seq_len, opt.refine.seed);
  const io::TextSplit split = io::parse_split(calib_split, "--calib-split");
  const std::optional<io::Tokenizer> tok = io::text_tokenizer_for(dir, calib);
  compress::CalibSet set =
      compress::calib_from_files(calib, m.spec().vocab_size, split, calib_samples, seq_len, tok ? &*tok : nullptr);
  const auto got = static_cast<int64_t>(set.sequences.size());
  if (got < calib_samples) {
    const std::string msg = "the --calib files hold " + std::to_string(got) + " sequence(s) of --seq-len " +
                            std::to_string(seq_len) + " tokens (" + std::to_string(set.tokens()) +
                            " tokens), fewer than --calib-samples " + std::to_string(calib_samples) +
                            ": calibrating on " + std::to_string(got) + " (give more data or a smaller --seq-len)";
    MOESQ_CHECK(!strict, msg, " [--strict]");
    std::fprintf(stderr, "WARNING: %s\n", msg.c_str());
  }
  if (calib_sampled > 0) {  // mixed: the files' sequences, then the sampled ones
    compress::CalibSet sampled = compress::calib_from_model(m, calib_sampled, seq_len, opt.refine.seed);
    set.sequences.insert(set.sequences.end(), std::make_move_iterator(sampled.sequences.begin()),
                         std::make_move_iterator(sampled.sequences.end()));
    set.source += " + " + std::to_string(calib_sampled) + " " + sampled.source;
  }
  return set;
}

}  // namespace moesq::cli

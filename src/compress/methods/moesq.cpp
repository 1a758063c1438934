// moesq: the SGPTQ solution refined per expert (paper Algorithm 1 lines 7–18: Gumbel-softmax supports,
// STE values, Lion; compress/refine/). Options: RefineOptions (compress/refine/options.h); report.json
// gets each expert's curves and schedule under "refine".
#include "compress/methods/sgptq_expert.h"
#include "compress/pipeline.h"
#include "compress/refine/loop.h"

namespace moesq::compress {

namespace {

// The refinement schedule an expert ran with, and where each value came from (report.json).
nlohmann::json schedule_json(const RefineResult& rr) {
  auto src = [](bool rule) { return rule ? "rule" : "set"; };
  nlohmann::json j = {{"batch", rr.batch}, {"epochs", rr.epochs}, {"steps", rr.steps}, {"lr_A", rr.lr_A}, {"lr_V", rr.lr_V},
          {"rule_rows", rr.schedule_rows},
          {"source", {{"batch", src(rr.batch_from_rule)}, {"epochs", src(rr.epochs_from_rule)},
                      {"lr_A", src(rr.lr_A_from_rule)}, {"lr_V", src(rr.lr_V_from_rule)}}}};
  if (rr.step_sequences > 0) j["step_sequences"] = rr.step_sequences;  // the layer-wide schedule
  return j;
}

PackedExpert compress_moesq(const ExpertJob& job, const CompressOptions& opt, ExpertReport& rep) {
  const SgptqExpert s = sgptq_expert(job, opt.sgptq, rep);
  const SgptqResult &rg = s.proj[0], &ru = s.proj[1], &rd = s.proj[2];
  const ExpertCalib& c = job.calib;
  ExpertData data;
  data.n = c.n;
  data.H = job.H;
  data.I = job.I;
  data.X = c.X.data();
  data.g = c.g.data();
  data.Y_ref = job.y_ref.empty() ? nullptr : job.y_ref.data();
  if (job.dev) {  // the rows on the GPU already: the device step backend reads them there
    data.X_dev = job.dev->X;
    data.Y_ref_dev = job.dev->Y;
  }
  data.stream = static_cast<uint64_t>(rep.layer) * 1000003ull + static_cast<uint64_t>(rep.expert);
  data.schedule_rows = c.schedule_rows;
  data.seq = c.seq.empty() ? nullptr : c.seq.data();
  data.num_sequences = c.num_sequences;
  data.layer_stream = static_cast<uint64_t>(rep.layer);
  data.variant = job.variant;
  const ProjInit ig{rg.dense_rounded.data(), rg.patterns.data(), job.gs_gu, &rg.packed};
  const ProjInit iu{ru.dense_rounded.data(), ru.patterns.data(), job.gs_gu, &ru.packed};
  const ProjInit id{rd.dense_rounded.data(), rd.patterns.data(), job.gs_d, &rd.packed};
  RefineResult rr = refine_expert(data, ig, iu, id, opt.refine);
  rep.extra = {{"init_hard_loss", rr.init_hard_loss}, {"final_hard_loss", rr.final_hard_loss},
               {"soft_loss", rr.curves.soft_loss}, {"hard_loss", rr.curves.hard_loss},
               {"epoch_seconds", rr.curves.epoch_seconds}, {"train_rows", rr.train_rows},
               {"heldout_rows", rr.heldout_rows}, {"steps", rr.steps},
               {"pattern_change", rr.pattern_change}, {"seconds", rr.seconds}, {"skipped", rr.skipped},
               {"selected_epoch", rr.selected_epoch},
               {"schedule", schedule_json(rr)}};
  ExpertReport::StageSeconds& st = rep.stage_seconds;
  st.refine_prepare = rr.stage_seconds.prepare;
  st.refine_start = rr.stage_seconds.start;
  st.refine_optimize = rr.stage_seconds.optimize;
  st.refine_finish = rr.stage_seconds.finish;
  for (const double e : rr.curves.epoch_seconds) st.refine_steps += e;
  if (rr.scale_finetune.steps > 0)
    rep.extra["scale_finetune"] = {{"steps", rr.scale_finetune.steps}, {"loss_before", rr.scale_finetune.loss_before},
                                   {"loss_after", rr.scale_finetune.loss_after}, {"kept", rr.scale_finetune.kept}};
  if (!rr.note.empty()) rep.note = rep.note.empty() ? rr.note : rep.note + "; " + rr.note;
  PackedExpert pe;
  pe.proj[0] = std::move(rr.gate);
  pe.proj[1] = std::move(rr.up);
  pe.proj[2] = std::move(rr.down);
  return pe;
}

void validate_moesq(const CompressOptions& opt) { validate(opt.refine); }

nlohmann::json moesq_json(const CompressOptions& opt) { return refine_options_to_json(opt.refine); }

}  // namespace

const Method methods::kMoesq = {
    .name = "moesq",
    .help = "SGPTQ + Gumbel/STE/Lion refinement",
    .refines = true,
    .validate = validate_moesq,
    .options_json = moesq_json,
    .manifest_key = "refine",
    .report_key = "refine_options",
    .compress = compress_moesq,
};

}  // namespace moesq::compress

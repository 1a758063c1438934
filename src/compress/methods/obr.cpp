// obr: the OBR baseline (compress/obr.h: Wanda pair supports, OBS + group error compensation, then
// GPTQ with the shared SGPTQ percdamp and block), without OBR's rotation (report.json "obr": rotation
// false). Options: ObrOptions.
#include "compress/obr.h"
#include "compress/pipeline.h"
#include "core/error.h"

namespace moesq::compress {

namespace {

PackedExpert compress_obr(const ExpertJob& job, const CompressOptions& opt, ExpertReport& rep) {
  SolvedExpert s = obr_expert(job.w, job.H, job.I, job.calib.X.data(), job.calib.n, job.gs_gu, job.gs_d, opt.obr,
                              opt.sgptq, job.names, job.variant);
  rep.fallback = s.fallback;
  rep.note = s.note;
  return std::move(s.packed);
}

void validate_obr(const CompressOptions& opt) {
  MOESQ_CHECK(opt.obr.alpha >= 0 && opt.obr.alpha <= 1, "--obr-alpha: ", opt.obr.alpha, " must be in [0, 1]");
}

nlohmann::json obr_json(const CompressOptions& opt) { return {{"alpha", opt.obr.alpha}, {"rtn", opt.obr.rtn}}; }

}  // namespace

const Method methods::kObr = {
    .name = "obr",
    .help = "Wanda pairs, OBS + group error compensation, GPTQ; the paper's baseline, docs/RESULTS.md",
    .validate = validate_obr,
    .options_json = obr_json,
    .manifest_key = "obr",
    .report_key = "obr",
    .omitted = "rotation",
    .compress = compress_obr,
};

}  // namespace moesq::compress

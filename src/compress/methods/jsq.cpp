// jsq: the JSQ baseline (compress/jsq.h: Wanda + quantization-range salience pair supports, RTN),
// without JSQ's activation smoothing (report.json "jsq": smoothing false). Options: JsqOptions.
#include <cmath>

#include "compress/jsq.h"
#include "compress/pipeline.h"
#include "core/error.h"

namespace moesq::compress {

namespace {

PackedExpert compress_jsq(const ExpertJob& job, const CompressOptions& opt, ExpertReport& rep) {
  SolvedExpert s = jsq_expert(job.w, job.H, job.I, job.calib.X.data(), job.calib.n, job.gs_gu, job.gs_d, opt.jsq,
                              job.names, job.variant);
  rep.fallback = s.fallback;
  rep.note = s.note;
  return std::move(s.packed);
}

void validate_jsq(const CompressOptions& opt) {
  const JsqOptions& o = opt.jsq;
  MOESQ_CHECK(o.rho >= 0 && std::isfinite(o.rho), "--jsq-rho: ", o.rho, " must be a finite value >= 0");
  MOESQ_CHECK(o.clip_high >= 0 && o.clip_high < 1, "jsq: clip_high=", o.clip_high, " must be in [0, 1)");
  MOESQ_CHECK(o.rows_per_mean > 0, "jsq: rows_per_mean=", o.rows_per_mean, " must be > 0");
}

nlohmann::json jsq_json(const CompressOptions& opt) {
  return {{"rho", opt.jsq.rho}, {"clip_high", opt.jsq.clip_high}, {"rows_per_mean", opt.jsq.rows_per_mean}};
}

}  // namespace

const Method methods::kJsq = {
    .name = "jsq",
    .help = "Wanda + quantization-range salience pairs, RTN; the paper's baseline, docs/RESULTS.md",
    .validate = validate_jsq,
    .options_json = jsq_json,
    .manifest_key = "jsq",
    .report_key = "jsq",
    .omitted = "smoothing",
    .compress = compress_jsq,
};

}  // namespace moesq::compress

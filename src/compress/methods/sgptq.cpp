// sgptq: SparseGPT's paired 4:8 support choice + GPTQ rounding per projection (compress/sgptq.h), on
// the expert's calibration Hessians. Its options (SgptqOptions) are the shared ones every run
// records, so the row has none of its own.
#include "compress/hessian.h"
#include "compress/methods/sgptq_expert.h"
#include "compress/pipeline.h"
#include "format/nvfp4.h"

namespace moesq::compress {

void note_sgptq_fallbacks(const SgptqExpert& s, ExpertReport& rep) {
  const SgptqResult &rg = s.proj[0], &ru = s.proj[1], &rd = s.proj[2];
  if (rg.fallback || ru.fallback || rd.fallback) {
    rep.fallback = true;
    rep.note = !rg.fallback_reason.empty() ? rg.fallback_reason
               : !rd.fallback_reason.empty() ? rd.fallback_reason : ru.fallback_reason;
  }
}

SgptqExpert sgptq_expert(const ExpertJob& job, const SgptqOptions& opt, ExpertReport& rep) {
  if (opt.device) return opt.device(job, opt, rep);
  const ExpertCalib& c = job.calib;
  const int64_t H = job.H, I = job.I;
  const Hessian Hx = accumulate_hessian(c.X.data(), c.n, H);
  SgptqExpert s;
  s.proj[0] = sgptq(job.w.gate.data(), I, H, Hx, job.gs_gu, opt, job.names[0]);
  s.proj[1] = sgptq(job.w.up.data(), I, H, Hx, job.gs_gu, opt, job.names[1]);
  std::vector<float> gq(static_cast<size_t>(I * H)), uq(static_cast<size_t>(I * H));
  format::sparse48_dequantize(s.proj[0].packed, gq.data());
  format::sparse48_dequantize(s.proj[1].packed, uq.data());
  std::vector<float> inter;
  model::swiglu_forward(gq.data(), uq.data(), job.w.down.data(), H, I, c.X.data(), c.n, 0, &inter, job.variant);
  const Hessian Hz = accumulate_hessian(inter.data(), c.n, I);
  s.proj[2] = sgptq(job.w.down.data(), H, I, Hz, job.gs_d, opt, job.names[2]);
  note_sgptq_fallbacks(s, rep);
  return s;
}

namespace {

PackedExpert compress_sgptq(const ExpertJob& job, const CompressOptions& opt, ExpertReport& rep) {
  SgptqExpert s = sgptq_expert(job, opt.sgptq, rep);
  PackedExpert pe;
  for (int p = 0; p < 3; ++p) pe.proj[p] = std::move(s.proj[p].packed);
  return pe;
}

}  // namespace

const Method methods::kSgptq = {
    .name = "sgptq",
    .help = "SparseGPT pairs + GPTQ",
    .compress = compress_sgptq,
};

}  // namespace moesq::compress

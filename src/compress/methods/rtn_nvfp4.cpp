// rtn-nvfp4: dense NVFP4, round to nearest (the 4.5 bits/weight baseline). Needs no calibration
// rows and has no options of its own.
#include "compress/method.h"
#include "format/nvfp4.h"

namespace moesq::compress {

namespace {

PackedExpert compress_rtn(const ExpertJob& job, const CompressOptions&, ExpertReport&) {
  PackedExpert pe;
  for (int p = 0; p < 3; ++p)
    pe.proj[p] = format::nvfp4_quantize(job.weights(p), job.N(p), job.K(p), job.tensor_scale(p), job.names[p]);
  return pe;
}

}  // namespace

const Method methods::kRtnNvfp4 = {
    .name = "rtn-nvfp4",
    .help = "dense NVFP4, 4.5 bpw baseline",
    .sparse = false,
    .compress = compress_rtn,
};

}  // namespace moesq::compress

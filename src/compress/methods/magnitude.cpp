// magnitude: paired 4:8 supports by pair magnitude (format::magnitude_patterns), values rounded to
// nearest. Needs no calibration rows and has no options of its own.
#include "compress/method.h"
#include "format/nvfp4.h"

namespace moesq::compress {

namespace {

PackedExpert compress_magnitude(const ExpertJob& job, const CompressOptions&, ExpertReport&) {
  PackedExpert pe;
  for (int p = 0; p < 3; ++p) {
    const std::vector<uint8_t> pat = format::magnitude_patterns(job.weights(p), job.N(p), job.K(p));
    pe.proj[p] =
        format::sparse48_quantize(job.weights(p), job.N(p), job.K(p), pat.data(), job.tensor_scale(p), job.names[p]);
  }
  return pe;
}

}  // namespace

const Method methods::kMagnitude = {
    .name = "magnitude",
    .help = "paired 4:8 by pair magnitude + RTN",
    .compress = compress_magnitude,
};

}  // namespace moesq::compress

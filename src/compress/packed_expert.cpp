#include "compress/packed_expert.h"

namespace moesq::compress {

std::vector<float> PackedProj::dequantize() const {
  std::vector<float> out(static_cast<size_t>(N() * K()));
  if (sparse)
    format::sparse48_dequantize(s, out.data());
  else
    format::nvfp4_dequantize(d, out.data());
  return out;
}

}  // namespace moesq::compress

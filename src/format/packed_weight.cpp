#include "format/packed_weight.h"

namespace moesq::format {

void PackedWeight::dequantize(float* out) const {
  if (const Sparse48Tensor* s = sparse48())
    sparse48_dequantize(*s, out);
  else
    nvfp4_dequantize(*nvfp4(), out);
}

std::vector<float> PackedWeight::dequantize() const {
  std::vector<float> out(static_cast<size_t>(N() * K()));
  dequantize(out.data());
  return out;
}

}  // namespace moesq::format

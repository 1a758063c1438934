#include "compress/expert_math.h"

#include <cmath>
#include <limits>


namespace moesq::compress {

double rel_sq_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(a[i]) * a[i];
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::quiet_NaN();
  return num / den;
}

}  // namespace moesq::compress

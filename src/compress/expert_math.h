// Reconstruction error measure shared by the pipeline's report (the expert forward itself is
// model::swiglu_forward, the same path the model runs).
#pragma once
#include <vector>

namespace moesq::compress {

// ‖a − b‖²_F / ‖a‖²_F (NaN when ‖a‖ = 0 and a ≠ b; 0 when both are zero)
double rel_sq_error(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace moesq::compress

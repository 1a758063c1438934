#include "io/tensor_names_deepseek_v3.h"

namespace moesq::io::deepseek_v3 {

std::string swiglu_weight(int64_t layer, const char* module, ExpertProj proj) {
  return layer_tensor(layer, std::string(module) + "." + kExpertProjNames[static_cast<int>(proj)] + kWeight);
}

}  // namespace moesq::io::deepseek_v3

#include "model/families.h"

namespace moesq::model {

namespace {

// One row per family. qwen3_moe, qwen2_moe, mixtral and olmoe all use the built-in GQA attention; they
// differ only in data (io::ModelSpec: qk_norm, biases, router, shared expert) and tensor names.
constexpr ModelFamily kFamilies[] = {
    {"qwen3_moe", nullptr},
    {"qwen2_moe", nullptr},
    {"mixtral", nullptr},
    {"olmoe", nullptr},
};

}  // namespace

const ModelFamily* find_model_family(const std::string& model_type) {
  for (const ModelFamily& f : kFamilies)
    if (model_type == f.model_type) return &f;
  return nullptr;
}

}  // namespace moesq::model

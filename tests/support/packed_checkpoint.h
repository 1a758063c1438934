// A moesq compressed checkpoint made from a dense one without calibration, for io / runtime tests:
// magnitude patterns + RTN (paired 4:8) or RTN (dense NVFP4) of every routed expert, gate|up sharing γ
// (format::gate_up_tensor_scale, the rule every method follows), written by write_compressed_checkpoint.
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "format/nvfp4.h"
#include "format/packed_weight.h"
#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "io/tensor_names.h"

namespace moesq::test {

// Every routed projection of `src`, packed, by io::expert_tensor_prefix.
inline std::map<std::string, format::PackedWeight> pack_all_experts(const io::Checkpoint& src, bool sparse) {
  std::map<std::string, format::PackedWeight> out;
  const io::ModelSpec& s = src.spec();
  const int64_t H = s.hidden_size, I = s.moe_intermediate_size;
  for (int64_t l = 0; l < s.num_layers; ++l)
    for (int64_t e = 0; e < s.num_experts; ++e) {
      std::vector<float> w[3];
      for (int p = 0; p < 3; ++p)
        w[p] = src.get_f32(io::expert_tensor_prefix(s, l, e, static_cast<io::ExpertProj>(p)) + io::kWeight);
      const float gu = format::gate_up_tensor_scale(w[0].data(), w[1].data(), I * H);
      for (int p = 0; p < 3; ++p) {
        const int64_t N = p == 2 ? H : I, K = p == 2 ? I : H;
        const float g = p == 2 ? 0.0f : gu;
        const std::string prefix = io::expert_tensor_prefix(s, l, e, static_cast<io::ExpertProj>(p));
        if (sparse) {
          const std::vector<uint8_t> pat = format::magnitude_patterns(w[p].data(), N, K);
          out[prefix] = format::sparse48_quantize(w[p].data(), N, K, pat.data(), g, prefix);
        } else {
          out[prefix] = format::nvfp4_quantize(w[p].data(), N, K, g, prefix);
        }
      }
    }
  return out;
}

// Writes `packed` as a moesq checkpoint into `dir` (created); returns dir.
inline std::string write_moesq_checkpoint(const io::Checkpoint& src, const std::map<std::string, format::PackedWeight>& packed,
                                          bool sparse, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  io::write_compressed_checkpoint(
      src, [&](int64_t l, int64_t e, io::ExpertProj p) -> const format::PackedWeight& {
        return packed.at(io::expert_tensor_prefix(src.spec(), l, e, p));
      },
      sparse, sparse ? "magnitude" : "rtn-nvfp4", dir.string());
  return dir.string();
}

}  // namespace moesq::test

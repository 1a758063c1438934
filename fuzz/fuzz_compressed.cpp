// libFuzzer target: the compressed-checkpoint validator — what `inspect` and the loader run on a
// checkpoint before any math: config.json → ModelSpec and quantization_config (moesq or
// compressed-tensors), the census of every routed-expert projection's storage against it
// (io::census_expert_storage / check_expert_storage, the "half-compressed" rule), and the decode of
// each projection (io::read_expert_weight_f32: packed NVFP4 / paired 4:8 / pair-bitmask / INT4 tensors,
// their dtypes, shapes, block-scale codes, metadata nibbles, global scales).
// Input: a 4-byte little-endian length L, then L bytes of config.json, then a model.safetensors; both
// land in a scratch directory (the reader maps files). Seeds: scripts/fuzz.sh (fuzz/make_seeds.cpp).
// Contract: a moesq::Error or finite dequantized weights — never a crash, a hang, a sanitizer report
// or another exception type.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "io/import_checkpoint.h"
#include "io/tensor_names.h"

namespace {

bool write(const std::string& path, const uint8_t* data, size_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(data, 1, n, f) == n;
  return std::fclose(f) == 0 && ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const size_t cfg_len = static_cast<size_t>(data[0]) | (static_cast<size_t>(data[1]) << 8) |
                         (static_cast<size_t>(data[2]) << 16) | (static_cast<size_t>(data[3]) << 24);
  if (cfg_len > size - 4) return 0;
  static const std::string dir = "/tmp/moesq_fuzz_compressed." + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  if (!write(dir + "/config.json", data + 4, cfg_len) ||
      !write(dir + "/model.safetensors", data + 4 + cfg_len, size - 4 - cfg_len))
    return 0;
  try {
    const moesq::io::Checkpoint ck(dir);
    const moesq::io::QuantizationConfig q = moesq::io::read_quantization_config(ck);
    const moesq::io::ExpertStorageCensus c = moesq::io::census_expert_storage(ck, q);
    if (c.mismatches < 0 || c.packed < 0 || c.dense < 0) std::abort();
    try {
      moesq::io::check_expert_storage(ck, q, false);
      if (c.mismatches != 0) std::abort();  // a mismatch must be refused without --allow-mixed
    } catch (const moesq::Error&) {
    }
    moesq::io::check_expert_storage(ck, q, true);
    (void)moesq::io::expert_tensor_bytes(ck);
    const moesq::io::ModelSpec& s = ck.spec();
    for (const std::string& name : ck.names()) {
      const auto t = moesq::io::parse_expert_tensor(name);
      if (!t || t->layer >= s.num_layers || t->expert >= s.num_experts || !s.is_moe_layer(t->layer)) continue;
      const bool down = t->proj == "down_proj";
      if (!down && t->proj != "gate_proj" && t->proj != "up_proj") continue;
      if (t->suffix != "weight" && t->suffix != "weight_packed" && t->suffix != "weight_sparse_packed") continue;
      const int64_t N = down ? s.hidden_size : s.moe_intermediate_size, K = down ? s.moe_intermediate_size : s.hidden_size;
      if (N > (1 << 12) || K > (1 << 12) || N * K > (1 << 16)) continue;  // bounded work per input
      const moesq::io::ExpertProj proj = down ? moesq::io::ExpertProj::Down
                                        : t->proj == "up_proj" ? moesq::io::ExpertProj::Up : moesq::io::ExpertProj::Gate;
      const std::string prefix = moesq::io::expert_tensor_prefix(s, t->layer, t->expert, proj);
      try {
        const std::vector<float> w = moesq::io::read_expert_weight_f32(ck, q, prefix, N, K);
        if (static_cast<int64_t>(w.size()) != N * K) std::abort();
        for (float v : w)
          if (!std::isfinite(v)) std::abort();  // class 1: nothing non-finite gets past the reader
      } catch (const moesq::Error&) {
      }
    }
  } catch (const moesq::Error&) {
  }
  return 0;
}

// libFuzzer target: config.json text → ModelSpec (io::parse_config), the tensor-shape-defining
// parser. Contract: malformed JSON is a parse error, any JSON is either a ModelSpec or a
// moesq::Error naming the key — never a crash or an nlohmann type_error escaping.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {  // parse_error, or out_of_range for 1e400 (as the readers do)
    return 0;
  }
  try {
    const moesq::io::ModelSpec s = moesq::io::parse_config(j, "fuzz/config.json");
    for (int64_t l = 0; l < s.num_layers && l < 1024; ++l) (void)s.is_moe_layer(l);
    s.check_seq_len(s.max_position_embeddings, "--seq-len");
  } catch (const moesq::Error&) {
  }
  return 0;
}

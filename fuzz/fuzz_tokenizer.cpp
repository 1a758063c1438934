// libFuzzer target: tokenizer.json (io/tokenizer.h). Byte 0 picks the mode:
//   even: the rest is a tokenizer.json → Tokenizer::from_json_text (vocab, merges, added tokens,
//         normalizer / pre-tokenizer / decoder / post-processor chains, regexes); a tokenizer that
//         loads then encodes and decodes a fixed sample with every option;
//   odd:  the rest is text, encoded by the two fixture tokenizers (tests/fixtures/tokenizers, the
//         Qwen-style byte-level and the Mistral-style byte-fallback BPE) and the byte identity, then
//         decoded again, and the same bytes read as little-endian 16-bit ids are decoded.
// Contract: a moesq::Error (invalid UTF-8, an unknown id, an unsupported component) or a result —
// never a crash, a sanitizer report or another exception type; the byte identity round-trips exactly.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"

namespace {

void exercise(const moesq::io::Tokenizer& t, std::string_view text) {
  for (const bool special : {true, false}) {
    std::vector<int32_t> ids;
    try {
      ids = t.encode(text, {special});
    } catch (const moesq::Error&) {
      continue;
    }
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) std::abort();  // encode promises ids of the vocabulary
    (void)t.decode(ids, {false});
    (void)t.decode(ids, {true});
  }
}

// The fixture tokenizers, loaded once before fuzzing starts (outside libFuzzer's per-input timeout:
// parsing the 230 KB files under ASan takes about a second).
const std::vector<moesq::io::Tokenizer>* g_fixtures = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_fixtures = new std::vector<moesq::io::Tokenizer>{
      moesq::io::load_tokenizer(MOESQ_FUZZ_TOKENIZERS "/bpe-bytelevel-qwen-style"),
      moesq::io::load_tokenizer(MOESQ_FUZZ_TOKENIZERS "/bpe-bytefallback-mistral-style")};
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    try {
      const moesq::io::Tokenizer t = moesq::io::Tokenizer::from_json_text(rest, "fuzz/tokenizer.json");
      (void)t.describe();
      exercise(t, "Hello, world! 123 <|im_start|> \xc3\xa9\xcc\x81 \xe4\xb8\xad \t\n  x");
      for (int32_t id = -1; id <= t.vocab_size() && id < 512; ++id) {
        (void)t.id_to_token(id);
        const int32_t one[1] = {id};
        try {
          (void)t.decode(one, {(id & 1) != 0});
        } catch (const moesq::Error&) {
        }
      }
    } catch (const moesq::Error&) {
    }
    return 0;
  }
  for (const moesq::io::Tokenizer& t : *g_fixtures) {
    exercise(t, rest);
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < rest.size(); i += 2)
      ids.push_back(static_cast<int16_t>(static_cast<uint8_t>(rest[i]) | (static_cast<uint8_t>(rest[i + 1]) << 8)));
    try {
      (void)t.decode(ids, {(data[0] & 2) != 0});
    } catch (const moesq::Error&) {
    }
  }
  const moesq::io::Tokenizer id = moesq::io::Tokenizer::byte_identity();
  const std::vector<int32_t> bytes = id.encode(rest);
  if (id.decode(bytes) != rest) std::abort();  // byte b ↔ id b exactly
  return 0;
}

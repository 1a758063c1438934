// libFuzzer target: the token-data readers (io/tokens.h) — a .npy token-id file (magic, version,
// header length, the Python-dict header, dtype, order, shape, data size, ids < vocab) or a text file
// of byte tokens, then the train / held-out split and the window cutter.
// Input: byte 0 picks the reader (bit 0: .npy or text), the split (bits 1-2) and the vocabulary
// (bits 3-7: 1, 2, 255, 256, 3000, 2^31 - 1, ...); byte 1 the window length; the rest is the file.
// Contract checked: a moesq::Error or token ids all in [0, vocab) — never a crash, a sanitizer
// report or another exception type.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "io/tokens.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const int64_t kVocab[8] = {1, 2, 200, 255, 256, 3000, 151936, 2147483647};
  const bool npy = data[0] & 1;
  const auto split = static_cast<moesq::io::TextSplit>(((data[0] >> 1) & 3) % 3);
  const int64_t vocab = kVocab[(data[0] >> 3) & 7];
  const int64_t seq_len = data[1];
  const std::string bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  try {
    const std::vector<int32_t> ids = moesq::io::parse_tokens(bytes, npy ? "fuzz.npy" : "fuzz.txt", vocab, split);
    for (int32_t id : ids)
      if (id < 0 || id >= vocab) std::abort();  // the reader promised ids < vocab
    const auto windows = moesq::io::make_windows(ids, seq_len);
    size_t total = 0;
    for (const auto& w : windows) {
      if (w.size() < 2 || static_cast<int64_t>(w.size()) > seq_len) std::abort();
      total += w.size();
    }
    if (total > ids.size()) std::abort();
  } catch (const moesq::Error&) {
  }
  return 0;
}

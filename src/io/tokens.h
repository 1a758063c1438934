// Token data for calibration and evaluation. Byte-level models: a text file's bytes are its tokens.
// `.npy` files hold token ids (int32 or uint32, 1-D or 2-D, C order); every id must be < vocab.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moesq::io {

enum class TextSplit { All, Train, Heldout };  // Train: first 98 %; Heldout: last 2 % (fixture rule)
// The one parser of a split name: "all" | "train" | "heldout"; Error naming `flag` otherwise.
TextSplit parse_split(const std::string& s, const char* flag = "--split");
const char* split_name(TextSplit s);

// Loads tokens from `path` (.npy or text). Error names the file if it is empty, unreadable, or holds
// ids >= vocab_size. A text file with bytes >= vocab_size is an error too.
std::vector<int32_t> load_tokens(const std::string& path, int64_t vocab_size,
                                 TextSplit split = TextSplit::All);
// The same on the file's bytes already read (`path` picks .npy or text by its extension and names the
// file in errors); load_tokens = read the file + this. The fuzz target fuzz/fuzz_tokens.cpp drives it.
std::vector<int32_t> parse_tokens(const std::string& bytes, const std::string& path, int64_t vocab_size,
                                  TextSplit split = TextSplit::All);

// Cuts `tokens` into consecutive windows of `seq_len` (the last one may be shorter; windows of
// fewer than 2 tokens are dropped).
std::vector<std::vector<int32_t>> make_windows(const std::vector<int32_t>& tokens, int64_t seq_len);

}  // namespace moesq::io

// Token data for calibration and evaluation. `.npy` files hold token ids (int32 or uint32, 1-D or
// 2-D, C order); every id must be < vocab. Text files go through the checkpoint's tokenizer
// (io/tokenizer.h); byte-level models (no tokenizer.json, vocab 256): a text file's bytes are its tokens.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace moesq::io {

enum class TextSplit { All, Train, Heldout };  // Train: first 98 %; Heldout: last 2 % (fixture rule)
// The one parser of a split name: "all" | "train" | "heldout"; Error naming `flag` otherwise.
TextSplit parse_split(const std::string& s, const char* flag = "--split");
const char* split_name(TextSplit s);

// Loads tokens from `path` (.npy or text). Error names the file if it is empty, unreadable, text with a
// NUL byte (a binary file such as a .safetensors: refused, not read as bytes), or holds
// ids >= vocab_size. Text: `text_tokenizer` encodes the whole file (UTF-8, no post-processor BOS —
// the file is a stream cut into windows, not one sequence); nullptr or the byte identity: byte value
// = token id, and a byte >= vocab_size is an error. The split cuts the token sequence (for bytes,
// the byte count, as before).
std::vector<int32_t> load_tokens(const std::string& path, int64_t vocab_size,
                                 TextSplit split = TextSplit::All, const Tokenizer* text_tokenizer = nullptr);
// The same on the file's bytes already read (`path` picks .npy or text by its extension and names the
// file in errors); load_tokens = read the file + this. The fuzz target fuzz/fuzz_tokens.cpp drives it.
std::vector<int32_t> parse_tokens(const std::string& bytes, const std::string& path, int64_t vocab_size,
                                  TextSplit split = TextSplit::All, const Tokenizer* text_tokenizer = nullptr);

// The tokenizer that text data files of checkpoint `dir` go through: load_tokenizer_for_checkpoint(dir)
// when some file of `files` is text, nullopt when all are .npy (ids need no tokenizer, so a checkpoint
// without tokenizer.json still reads them). Errors are load_tokenizer_for_checkpoint's (name `dir`).
std::optional<Tokenizer> text_tokenizer_for(const std::string& dir, const std::vector<std::string>& files);

// Cuts `tokens` into consecutive windows of `seq_len` (the last one may be shorter; windows of
// fewer than 2 tokens are dropped).
std::vector<std::vector<int32_t>> make_windows(const std::vector<int32_t>& tokens, int64_t seq_len);

}  // namespace moesq::io

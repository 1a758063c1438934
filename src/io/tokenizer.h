// Text ↔ token ids for real checkpoints: a Hugging Face `tokenizer.json` reader (BPE) and the
// byte-level identity tokenizer of the tiny models (byte value = token id).
// Compatibility target: the `tokenizers` library's `encode(text).ids` and
// `decode(ids, skip_special_tokens)` — bit-exact on tests/fixtures/tokenizers/*/reference_encodings.json.
// Non-obvious decision: only the components real MoE checkpoints ship are implemented (listed below);
// any other component is refused at load time with an Error naming the JSON path and its type, so a
// tokenizer either matches the library or does not load — it never silently tokenizes differently.
//
// Supported tokenizer.json components:
//   model          BPE (vocab; merges as "a b" strings or [a, b] pairs; unk_token, fuse_unk,
//                  byte_fallback <0xNN>, ignore_merges); dropout must be null
//   normalizer     NFC, Prepend, Replace (String or Regex pattern), Sequence, null
//   pre_tokenizer  Split (Regex/String pattern; Isolated, Removed, MergedWithPrevious, MergedWithNext),
//                  ByteLevel (add_prefix_space, use_regex = the GPT-2 pattern), Sequence, null
//   post_processor TemplateProcessing (single sequence), ByteLevel (ids unchanged), null
//   decoder        ByteLevel, Replace, ByteFallback, Fuse, Strip, Sequence, null
//   added_tokens   matched leftmost-longest before normalization (normalized=false) or after it
//                  (normalized=true); lstrip/rstrip absorb neighbouring whitespace; single_word=true
//                  is refused
// Regexes run on PCRE2 (UTF + UCP: \p{L}, \p{N}, \s are Unicode classes, as in the library's
// Oniguruma); NFC comes from ICU.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moesq::io {

struct EncodeOptions {
  // Apply the post-processor (e.g. Mistral's BOS `<s>`). false = the library's
  // `encode(text, add_special_tokens=False)`. Special tokens written in the text are still matched.
  bool add_special_tokens = true;
};

struct DecodeOptions {
  bool skip_special_tokens = false;  // drop ids of added tokens marked "special" before decoding
};

// Immutable after loading; copies share the loaded tables (cheap to pass by value), and encode /
// decode keep no mutable state, so one Tokenizer may be used from many threads at once.
class Tokenizer {
 public:
  // Parses a tokenizer.json. Error (message starts with the path) when the file is missing,
  // is not JSON, is malformed (e.g. `model.merges[3]`), or uses an unsupported component
  // (`tokenizer.json: normalizer.type "NFKC" is not supported`).
  static Tokenizer from_file(const std::string& tokenizer_json_path);
  // Same, from text already read; `source` names it in errors.
  static Tokenizer from_json_text(std::string_view json_text, const std::string& source);
  // The byte-level identity tokenizer: byte b ↔ id b, no special tokens (the tiny models).
  static Tokenizer byte_identity();

  // UTF-8 text → ids. Error when `text` is not valid UTF-8 (names the byte offset); the byte
  // identity tokenizer accepts any bytes.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const;
  // ids → UTF-8 text (invalid byte sequences become U+FFFD, as the library does). Error naming the
  // position when an id is negative or not in the vocabulary.
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& opts = {}) const;

  // One more than the largest id (model vocabulary and added tokens).
  int64_t vocab_size() const;
  // The token string of `id` (added tokens first, then the model vocabulary); nullopt if unknown.
  // Byte-level BPE strings are in the byte→unicode alphabet (space = "Ġ").
  std::optional<std::string> id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_byte_identity() const;
  // One line for humans: "BPE, byte-level, 3000 tokens, 3 added (3 special), from PATH".
  std::string describe() const;

  struct Impl;  // tokenizer.cpp

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// `path` is a tokenizer.json file, or a directory holding one. Error naming `path` otherwise.
Tokenizer load_tokenizer(const std::string& path);

// The tokenizer a checkpoint's text inputs (--calib, eval --data, generate --prompt) go through:
// DIR/tokenizer.json when present; otherwise the byte identity when DIR/config.json says
// vocab_size 256 (the tiny byte-level models ship no tokenizer); otherwise an Error naming DIR.
Tokenizer load_tokenizer_for_checkpoint(const std::string& dir);

}  // namespace moesq::io

// Internal pieces of io::Tokenizer (not a public header): UTF-8 helpers, the byte-level alphabet,
// a PCRE2 regex wrapper, and the normalizer / pre-tokenizer / BPE / decoder components that
// tokenizer_json.cpp builds from the JSON and tokenizer.cpp chains. Each component mirrors one
// `type` of the `tokenizers` library and follows its algorithm step for step (cited per function).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/tokenizer.h"

namespace moesq::io::tok {

// ---- UTF-8 ------------------------------------------------------------------------------------
// Length of the valid UTF-8 sequence at s[i], or 0 when it is invalid; `*valid_prefix` receives the
// number of bytes that form a valid prefix (the "maximal subpart" that Rust's from_utf8_lossy
// replaces by one U+FFFD).
size_t utf8_seq_len(std::string_view s, size_t i, size_t* valid_prefix = nullptr);
// Offset of the first invalid byte, or npos.
size_t utf8_first_invalid(std::string_view s);
// Rust String::from_utf8_lossy.
std::string utf8_lossy(std::string_view bytes);
void append_utf8(std::string& out, uint32_t cp);

// ---- byte-level alphabet (GPT-2 bytes_to_unicode) -----------------------------------------------
// Printable bytes map to themselves; the other 68 to U+0100 + n in byte order (space → "Ġ").
const std::array<std::string, 256>& byte_to_unicode();
// Inverse on one code point; -1 when the code point is not in the alphabet.
int unicode_to_byte(uint32_t cp);

// ---- regex ------------------------------------------------------------------------------------
class Regex {
 public:
  // `literal`: the pattern is a plain string (Split/Replace with {"String": ...}).
  Regex(const std::string& pattern, bool literal, const std::string& where);
  // Non-overlapping matches [begin, end) as byte offsets, left to right; empty matches skipped.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;

 private:
  std::shared_ptr<void> code_;  // pcre2_code_8
};

// ---- normalizers ------------------------------------------------------------------------------
struct Normalizer {
  enum class Kind { NFC, Prepend, Replace } kind;
  std::string content;          // Prepend: prefix; Replace: replacement
  std::optional<Regex> pattern;  // Replace
};
std::string normalize(const std::vector<Normalizer>& chain, std::string s);

// ---- pre-tokenizers ---------------------------------------------------------------------------
struct PreTokenizer {
  enum class Kind { Split, ByteLevel } kind;
  enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext } behavior =
      Behavior::Isolated;
  std::optional<Regex> pattern;  // Split; ByteLevel with use_regex
  bool add_prefix_space = false;  // ByteLevel
};
// One normalized segment → the words BPE sees.
std::vector<std::string> pre_tokenize(const std::vector<PreTokenizer>& chain, std::string s);

// ---- BPE model --------------------------------------------------------------------------------
struct Bpe {
  std::unordered_map<std::string, int32_t> vocab;
  // id → token string. A map, not a table of max id + 1 entries: ids come from the file, and one id
  // of 2^31 - 1 must not make a table of 2^31 strings.
  std::unordered_map<int32_t, std::string> id_to_token;
  int64_t id_end = 0;  // largest vocab id + 1 (0 for an empty vocab)
  // (left id << 32 | right id) → (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  std::optional<int32_t> unk_id;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::array<int32_t, 256> byte_ids{};  // <0xNN> ids when byte_fallback; -1 where missing
  // Appends the ids of one word (tokenizers' BPE::merge_word + Word::merge_all).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;
};

// ---- decoders ---------------------------------------------------------------------------------
struct Decoder {
  enum class Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip } kind;
  std::optional<Regex> pattern;  // Replace
  std::string content;           // Replace: replacement; Strip: the character stripped
  int64_t start = 0, stop = 0;   // Strip: how many leading / trailing `content` to remove
};
// tokenizers' Decoder::decode_chain for each decoder in turn, then joined.
std::string decode_tokens(const std::vector<Decoder>& chain, std::vector<std::string> tokens);

}  // namespace moesq::io::tok

// ---- the whole tokenizer (tokenizer.cpp runs it, tokenizer_json.cpp builds it) ----------------

namespace moesq::io {

struct Tokenizer::Impl {
  std::string source;     // file path (errors, describe())
  bool identity = false;  // byte b ↔ id b; nothing below is used
  struct AddedToken {
    std::string content;
    int32_t id = 0;
    bool special = false, normalized = false, lstrip = false, rstrip = false;
  };
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;            // id → index into `added`
  std::unordered_map<std::string, size_t> added_by_content;   // content → index into `added`
  std::array<std::vector<size_t>, 256> added_by_first_byte;   // first byte → indices into `added`
  std::vector<tok::Normalizer> normalizers;
  std::vector<tok::PreTokenizer> pre_tokenizers;
  tok::Bpe bpe;
  // Post-processor for a single sequence: the template's items; nullopt = the sequence itself.
  // Empty = no template (no post-processor, or ByteLevel which leaves ids alone).
  std::vector<std::optional<std::vector<int32_t>>> template_single;
  bool has_decoder = false;  // without one, tokens are joined with " " (tokenizers)
  std::vector<tok::Decoder> decoders;
  std::string summary;  // "BPE, byte-level" etc.
};

std::shared_ptr<Tokenizer::Impl> parse_tokenizer_json(std::string_view json_text, const std::string& source);

}  // namespace moesq::io

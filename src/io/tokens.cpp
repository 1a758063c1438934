// Token loading: text files (one byte = one token) and NumPy .npy token-id arrays.
// Non-obvious decisions: (1) the Train/Heldout cut is floor(0.98 · size) computed in integers
// (size · 98 / 100), the rule the fixture model was trained with, and it is applied to the token
// count for .npy files as it is to the byte count for text; (2) the .npy header is parsed by a small
// strict parser of the dict numpy writes, accepting only little-endian int32/uint32, C order, 1-D or
// 2-D, with the data size matching the shape exactly.
#include "io/tokens.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace moesq::io {

namespace {

constexpr int64_t kTrainPercent = 98;  // fixture rule: first 98 % trains, last 2 % is held out

std::string read_all(const std::string& path) {
  std::error_code ec;
  MOESQ_CHECK(std::filesystem::is_regular_file(path, ec), "data file ", path,
              " does not exist or is not a regular file");
  const auto size = std::filesystem::file_size(path, ec);
  MOESQ_CHECK(!ec, "cannot stat data file ", path, ": ", ec.message());
  std::ifstream in(path, std::ios::binary);
  MOESQ_CHECK(in, "cannot read data file ", path);
  std::string bytes(size, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  MOESQ_CHECK(static_cast<uintmax_t>(in.gcount()) == size, "short read of data file ", path, " (",
              in.gcount(), " of ", size, " bytes)");
  return bytes;
}

bool ends_with_npy(const std::string& path) {
  if (path.size() < 4) return false;
  std::string ext = path.substr(path.size() - 4);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".npy";
}

// Minimal reader of the Python dict literal in a .npy header:
// {'descr': '<i4', 'fortran_order': False, 'shape': (3, 4), }
struct NpyHeader {
  std::string descr;
  bool fortran_order = true;
  std::vector<int64_t> shape;
};

class DictParser {
 public:
  DictParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') break;
      const std::string key = string_lit();
      expect(':');
      skip_ws();
      if (key == "descr") {
        h.descr = string_lit();
        have_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = bool_lit();
        have_order = true;
      } else if (key == "shape") {
        h.shape = tuple_lit();
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_ws();
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++pos_;
    if (!have_descr || !have_order || !have_shape) fail("needs 'descr', 'fortran_order' and 'shape'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    MOESQ_FAIL(path_, ": malformed .npy header (", why, " at offset ", pos_, "): ", s_);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string_lit() {
    skip_ws();
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a string");
    const size_t end = s_.find(q, pos_ + 1);
    if (end == std::string::npos) fail("unterminated string");
    std::string out = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return out;
  }
  bool bool_lit() {
    if (s_.compare(pos_, 4, "True") == 0) {
      pos_ += 4;
      return true;
    }
    if (s_.compare(pos_, 5, "False") == 0) {
      pos_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  std::vector<int64_t> tuple_lit() {
    std::vector<int64_t> dims;
    expect('(');
    while (true) {
      skip_ws();
      if (peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a non-negative dimension");
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) fail("dimension too large");
        v = v * 10 + (s_[pos_++] - '0');
      }
      dims.push_back(v);
      skip_ws();
      if (peek() == ',') ++pos_;
      else if (peek() != ')') fail("expected ',' or ')'");
    }
    ++pos_;
    return dims;
  }

  const std::string& s_;
  const std::string& path_;
  size_t pos_ = 0;
};

std::vector<int32_t> parse_npy(const std::string& bytes, const std::string& path, int64_t vocab_size) {
  static const char kMagic[] = "\x93NUMPY";
  MOESQ_CHECK(bytes.size() >= 10 && bytes.compare(0, 6, kMagic, 6) == 0, path,
              ": not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  MOESQ_CHECK(major >= 1 && major <= 3, path, ": unsupported .npy version ", major);
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    header_start = 10;
  } else {
    MOESQ_CHECK(bytes.size() >= 12, path, ": truncated .npy header");
    for (int i = 3; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[8 + i]);
    header_start = 12;
  }
  MOESQ_CHECK(header_len <= bytes.size() - header_start, path, ": .npy header length ", header_len,
              " runs past the end of the file (", bytes.size(), " bytes)");
  const std::string text = bytes.substr(header_start, header_len);
  const NpyHeader h = DictParser(text, path).parse();

  const bool is_signed = h.descr == "<i4";
  MOESQ_CHECK(is_signed || h.descr == "<u4", path, ": .npy dtype '", h.descr,
              "' is not supported (token ids must be little-endian int32 '<i4' or uint32 '<u4')");
  MOESQ_CHECK(!h.fortran_order, path, ": .npy array is in Fortran order; save it in C order");
  MOESQ_CHECK(h.shape.size() == 1 || h.shape.size() == 2, path, ": .npy array has ", h.shape.size(),
              " dimensions; token ids must be 1-D or 2-D");
  uint64_t count = 1;
  for (int64_t d : h.shape) {
    MOESQ_CHECK(!__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count), path,
                ": .npy shape overflows");
  }
  const size_t data_start = header_start + header_len;
  const uint64_t data_bytes = bytes.size() - data_start;
  MOESQ_CHECK(count <= data_bytes / 4 && count * 4 == data_bytes, path, ": .npy shape needs ", count,
              " × 4 bytes of data, the file holds ", data_bytes);
  MOESQ_CHECK(count > 0, path, ": .npy array holds no tokens");

  std::vector<int32_t> ids(count);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + data_start);
  for (uint64_t i = 0; i < count; ++i) {
    const uint32_t u = static_cast<uint32_t>(p[4 * i]) | (static_cast<uint32_t>(p[4 * i + 1]) << 8) |
                       (static_cast<uint32_t>(p[4 * i + 2]) << 16) |
                       (static_cast<uint32_t>(p[4 * i + 3]) << 24);
    const int64_t id = is_signed ? static_cast<int64_t>(static_cast<int32_t>(u)) : static_cast<int64_t>(u);
    MOESQ_CHECK(id >= 0 && id < vocab_size, path, ": token id ", id, " at flat index ", i,
                " is outside the vocabulary [0, ", vocab_size, ")");
    ids[i] = static_cast<int32_t>(id);
  }
  return ids;
}

}  // namespace

std::vector<int32_t> load_tokens(const std::string& path, int64_t vocab_size, TextSplit split,
                                 const Tokenizer* text_tokenizer) {
  MOESQ_CHECK(vocab_size > 0, "load_tokens(", path, "): vocab_size must be positive");
  return parse_tokens(read_all(path), path, vocab_size, split, text_tokenizer);
}

std::vector<int32_t> parse_tokens(const std::string& bytes, const std::string& path, int64_t vocab_size,
                                  TextSplit split, const Tokenizer* text_tokenizer) {
  MOESQ_CHECK(vocab_size > 0, "load_tokens(", path, "): vocab_size must be positive");
  MOESQ_CHECK(!bytes.empty(), "data file ", path, " is empty");

  std::vector<int32_t> ids;
  if (ends_with_npy(path)) {
    ids = parse_npy(bytes, path, vocab_size);
    // A text file never holds a NUL byte; a binary one (a .safetensors, a .bin of ids) nearly always does
    // within its first bytes, and read as text it would be evaluated as garbage without a word.
  } else if (const size_t nul = bytes.find('\0'); nul != std::string::npos) {
    MOESQ_FAIL("data file ", path, " is not text: NUL byte at offset ", nul,
               " (token ids go in a .npy file of int32/uint32; text files are read through the tokenizer)");
  } else if (text_tokenizer && !text_tokenizer->is_byte_identity()) {
    try {
      ids = text_tokenizer->encode(bytes, EncodeOptions{.add_special_tokens = false});
    } catch (const Error& e) {
      MOESQ_FAIL(path, ": cannot tokenize (", e.what(), ")");
    }
    MOESQ_CHECK(!ids.empty(), "data file ", path, " tokenizes to no tokens");
    for (size_t i = 0; i < ids.size(); ++i)
      MOESQ_CHECK(ids[i] >= 0 && ids[i] < vocab_size, path, ": token id ", ids[i], " at token ", i,
                  " (from ", text_tokenizer->describe(), ") is outside the model vocabulary [0, ", vocab_size,
                  ")");
  } else {
    ids.resize(bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) {
      const int32_t b = static_cast<unsigned char>(bytes[i]);
      MOESQ_CHECK(b < vocab_size, path, ": byte ", b, " at offset ", i,
                  " is outside the vocabulary [0, ", vocab_size, ") of a byte-level model");
      ids[i] = b;
    }
  }
  if (split == TextSplit::All) return ids;
  const size_t cut = static_cast<size_t>(static_cast<uint64_t>(ids.size()) * kTrainPercent / 100);
  std::vector<int32_t> part = split == TextSplit::Train
                                  ? std::vector<int32_t>(ids.begin(), ids.begin() + cut)
                                  : std::vector<int32_t>(ids.begin() + cut, ids.end());
  MOESQ_CHECK(!part.empty(), "data file ", path, ": the ", split == TextSplit::Train ? "train" : "held-out",
              " split of ", ids.size(), " tokens is empty");
  return part;
}

std::vector<std::vector<int32_t>> make_windows(const std::vector<int32_t>& tokens, int64_t seq_len) {
  MOESQ_CHECK(seq_len >= 2, "--seq-len must be at least 2 (a window predicts its tokens after the first), got ",
              seq_len);
  std::vector<std::vector<int32_t>> windows;
  for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(seq_len)) {
    const size_t end = std::min(tokens.size(), start + static_cast<size_t>(seq_len));
    if (end - start < 2) break;
    windows.emplace_back(tokens.begin() + start, tokens.begin() + end);
  }
  return windows;
}

std::optional<Tokenizer> text_tokenizer_for(const std::string& dir, const std::vector<std::string>& files) {
  for (const auto& f : files)
    if (!ends_with_npy(f)) return load_tokenizer_for_checkpoint(dir);
  return std::nullopt;
}

TextSplit parse_split(const std::string& s, const char* flag) {
  if (s == "all") return TextSplit::All;
  if (s == "train") return TextSplit::Train;
  if (s == "heldout") return TextSplit::Heldout;
  MOESQ_FAIL(flag, ": \"", s, "\" is not one of all, train, heldout");
}

const char* split_name(TextSplit s) {
  switch (s) {
    case TextSplit::All: return "all";
    case TextSplit::Train: return "train";
    case TextSplit::Heldout: return "heldout";
  }
  return "?";
}

}  // namespace moesq::io

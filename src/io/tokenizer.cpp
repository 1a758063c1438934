// io::Tokenizer: the encode / decode pipelines and the loaders (tokenizer.h).
// Encode, as the `tokenizers` library orders it: added tokens with normalized=false are cut out of
// the raw text (leftmost-longest); each remaining segment is normalized on its own (so a Prepend
// normalizer prefixes every segment), then cut on normalized=true added tokens, pre-tokenized into
// words, and each word goes through BPE; finally the post-processor template (BOS) is applied.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/tokenizer_parts.h"

namespace moesq::io {

namespace {

namespace fs = std::filesystem;

// Rust char::is_whitespace (Unicode White_Space), for lstrip/rstrip of added tokens.
bool is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

uint32_t cp_at(std::string_view s, size_t i) {
  const size_t n = tok::utf8_seq_len(s, i);
  std::string_view c = s.substr(i, n);
  uint32_t cp = static_cast<uint8_t>(c[0]);
  if (n == 2) cp = cp & 0x1F;
  if (n == 3) cp = cp & 0x0F;
  if (n == 4) cp = cp & 0x07;
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(c[k]) & 0x3F);
  return cp;
}

struct Segment {
  std::string text;
  int32_t id = -1;  // >= 0: an added token
};

// Cuts `s` on the added tokens whose `normalized` flag equals `normalized` (leftmost, then longest).
std::vector<Segment> split_added(const Tokenizer::Impl& t, const std::string& s, bool normalized) {
  std::vector<Segment> out;
  size_t start_offset = 0;
  size_t i = 0;
  while (i < s.size()) {
    const Tokenizer::Impl::AddedToken* best = nullptr;
    for (const size_t k : t.added_by_first_byte[static_cast<uint8_t>(s[i])]) {
      const auto& a = t.added[k];
      if (a.normalized != normalized || a.content.size() > s.size() - i) continue;
      if (s.compare(i, a.content.size(), a.content) != 0) continue;
      if (!best || a.content.size() > best->content.size()) best = &a;
    }
    if (!best) {
      i += std::max<size_t>(1, tok::utf8_seq_len(s, i));
      continue;
    }
    size_t start = i, stop = i + best->content.size();
    if (best->lstrip) {  // absorb whitespace on the left, back to the previous cut
      size_t k = start;
      while (k > start_offset) {
        size_t b = k - 1;
        while (b > start_offset && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
        if (!is_whitespace(cp_at(s, b))) break;
        k = b;
      }
      start = k;
    }
    if (best->rstrip) {
      while (stop < s.size() && is_whitespace(cp_at(s, stop))) stop += tok::utf8_seq_len(s, stop);
    }
    if (start > start_offset) out.push_back({s.substr(start_offset, start - start_offset), -1});
    out.push_back({"", best->id});
    start_offset = i = stop;
  }
  if (start_offset < s.size()) out.push_back({s.substr(start_offset), -1});
  return out;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) MOESQ_FAIL(path, ": no such file");
  if (fs::is_directory(path, ec)) MOESQ_FAIL(path, ": is a directory, expected a tokenizer.json file");
  std::ifstream f(path, std::ios::binary);
  if (!f) MOESQ_FAIL(path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& source) {
  return Tokenizer(parse_tokenizer_json(json_text, source));
}

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json_path) {
  return from_json_text(read_text_file(tokenizer_json_path), tokenizer_json_path);
}

Tokenizer Tokenizer::byte_identity() {
  auto impl = std::make_shared<Impl>();
  impl->identity = true;
  impl->source = "byte-level identity";
  impl->summary = "byte-level identity (byte value = token id)";
  return Tokenizer(impl);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  const Impl& t = *impl_;
  std::vector<int32_t> ids;
  if (t.identity) {
    ids.reserve(text.size());
    for (const char c : text) ids.push_back(static_cast<uint8_t>(c));
    return ids;
  }
  if (const size_t bad = tok::utf8_first_invalid(text); bad != std::string_view::npos)
    MOESQ_FAIL("tokenizer ", t.source, ": input text is not valid UTF-8 (byte offset ", bad, ")");
  for (const Segment& raw : split_added(t, std::string(text), /*normalized=*/false)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const std::string normalized = tok::normalize(t.normalizers, raw.text);
    for (const Segment& seg : split_added(t, normalized, /*normalized=*/true)) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
        continue;
      }
      for (const std::string& word : tok::pre_tokenize(t.pre_tokenizers, seg.text)) t.bpe.tokenize(word, ids);
    }
  }
  if (!opts.add_special_tokens || t.template_single.empty()) return ids;
  std::vector<int32_t> out;
  out.reserve(ids.size() + t.template_single.size());
  for (const auto& item : t.template_single) {
    if (item) out.insert(out.end(), item->begin(), item->end());
    else out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& opts) const {
  const Impl& t = *impl_;
  if (t.identity) {
    std::string out;
    out.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      MOESQ_CHECK(ids[i] >= 0 && ids[i] < 256, "decode: id ", ids[i], " at position ", i,
                  " is not a byte (the byte-level identity tokenizer has ids 0..255)");
      out += static_cast<char>(ids[i]);
    }
    return out;
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (const auto a = t.added_by_id.find(id); a != t.added_by_id.end()) {
      if (!(opts.skip_special_tokens && t.added[a->second].special)) tokens.push_back(t.added[a->second].content);
      continue;
    }
    const auto known = t.bpe.id_to_token.find(id);
    MOESQ_CHECK(known != t.bpe.id_to_token.end() && !known->second.empty(), "decode: id ", id, " at position ", i,
                " is not in the vocabulary of ", t.source, " (vocab_size ", vocab_size(), ")");
    tokens.push_back(known->second);
  }
  if (!t.has_decoder) {  // tokenizers joins the raw tokens with spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  return tok::decode_tokens(t.decoders, std::move(tokens));
}

int64_t Tokenizer::vocab_size() const {
  const Impl& t = *impl_;
  if (t.identity) return 256;
  int64_t n = t.bpe.id_end;
  for (const auto& a : t.added) n = std::max<int64_t>(n, int64_t{a.id} + 1);
  return n;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const Impl& t = *impl_;
  if (t.identity) {
    if (id < 0 || id > 255) return std::nullopt;
    return std::string(1, static_cast<char>(id));
  }
  if (const auto a = t.added_by_id.find(id); a != t.added_by_id.end()) return t.added[a->second].content;
  if (const auto k = t.bpe.id_to_token.find(id); k != t.bpe.id_to_token.end() && !k->second.empty()) return k->second;
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const Impl& t = *impl_;
  if (t.identity) {
    if (token.size() != 1) return std::nullopt;
    return static_cast<int32_t>(static_cast<uint8_t>(token[0]));
  }
  if (const auto a = t.added_by_content.find(std::string(token)); a != t.added_by_content.end())
    return t.added[a->second].id;
  if (const auto v = t.bpe.vocab.find(std::string(token)); v != t.bpe.vocab.end()) return v->second;
  return std::nullopt;
}

bool Tokenizer::is_byte_identity() const { return impl_->identity; }

std::string Tokenizer::describe() const {
  const Impl& t = *impl_;
  if (t.identity) return t.summary + ", 256 tokens";
  size_t special = 0;
  for (const auto& a : t.added) special += a.special;
  return detail::concat(t.summary, ", ", vocab_size(), " tokens, ", t.added.size(), " added (", special,
                        " special), from ", t.source);
}

Tokenizer load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path file = fs::path(path) / "tokenizer.json";
    MOESQ_CHECK(fs::exists(file, ec), path, ": no tokenizer.json in this directory");
    return Tokenizer::from_file(file.string());
  }
  return Tokenizer::from_file(path);
}

Tokenizer load_tokenizer_for_checkpoint(const std::string& dir) {
  std::error_code ec;
  MOESQ_CHECK(fs::is_directory(dir, ec), dir, ": not a directory (expected a checkpoint directory)");
  const fs::path file = fs::path(dir) / "tokenizer.json";
  if (fs::exists(file, ec)) return Tokenizer::from_file(file.string());
  const fs::path config = fs::path(dir) / "config.json";
  MOESQ_CHECK(fs::exists(config, ec), dir, ": has neither tokenizer.json nor config.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(config.string()));
  } catch (const nlohmann::json::exception& e) {
    MOESQ_FAIL(config.string(), ": not valid JSON (", e.what(), ")");
  }
  const auto it = j.find("vocab_size");
  MOESQ_CHECK(it != j.end() && it->is_number_integer(), config.string(), ": no integer vocab_size");
  MOESQ_CHECK(it->get<int64_t>() == 256, dir, ": no tokenizer.json, and config.json vocab_size is ",
              it->get<int64_t>(), ", not 256 — only byte-level checkpoints (byte value = token id) need none; "
              "copy the model's tokenizer.json into the directory");
  return Tokenizer::byte_identity();
}

}  // namespace moesq::io

// String-level components of io::Tokenizer: UTF-8, the byte-level alphabet, PCRE2 regexes,
// normalizers, pre-tokenizers and decoders (tokenizer_parts.h).
// Non-obvious decision: every component copies the `tokenizers` library's algorithm literally —
// including its corner cases (Prepend skips empty strings, ByteFallback turns an invalid byte run
// into one U+FFFD per byte, Strip counts bytes where it means characters) — because the oracle is
// that library's output, not a cleaner definition.
#define PCRE2_CODE_UNIT_WIDTH 8
#if MOESQ_HAVE_PCRE2
#include <pcre2.h>
#endif
#if MOESQ_HAVE_ICU
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#endif

#include <algorithm>

#include "core/error.h"
#include "io/tokenizer_parts.h"

namespace moesq::io::tok {

// ---- UTF-8 ------------------------------------------------------------------------------------

size_t utf8_seq_len(std::string_view s, size_t i, size_t* valid_prefix) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // range of the second byte (RFC 3629 table)
  if (c < 0x80) {
    if (valid_prefix) *valid_prefix = 1;
    return 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;
  } else {
    if (valid_prefix) *valid_prefix = 1;  // a lone invalid byte is its own maximal subpart
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    const bool ok = i + k < s.size() && b(i + k) >= (k == 1 ? lo : 0x80) && b(i + k) <= (k == 1 ? hi : 0xBF);
    if (!ok) {
      if (valid_prefix) *valid_prefix = k;
      return 0;
    }
  }
  if (valid_prefix) *valid_prefix = need + 1;
  return need + 1;
}

size_t utf8_first_invalid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_seq_len(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    size_t prefix = 0;
    const size_t n = utf8_seq_len(bytes, i, &prefix);
    if (n) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += prefix;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Decodes the (valid) code point at s[i]; advances i.
uint32_t next_cp(std::string_view s, size_t& i) {
  const size_t n = utf8_seq_len(s, i);
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k])); };
  uint32_t cp = 0;
  switch (n) {
    case 1: cp = b(0); break;
    case 2: cp = ((b(0) & 0x1F) << 6) | (b(1) & 0x3F); break;
    case 3: cp = ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F); break;
    case 4: cp = ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F); break;
    default: cp = 0xFFFD, i += 1; return cp;
  }
  i += n;
  return cp;
}

bool printable_byte(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

}  // namespace

// ---- byte-level alphabet ----------------------------------------------------------------------

const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) append_utf8(t[b], printable_byte(b) ? static_cast<uint32_t>(b) : next++);
    return t;
  }();
  return table;
}

int unicode_to_byte(uint32_t cp) {
  static const std::array<int, 324> inverse = [] {
    std::array<int, 324> inv;
    inv.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) inv[printable_byte(b) ? b : next++] = b;
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

// ---- regex ------------------------------------------------------------------------------------

#if MOESQ_HAVE_PCRE2
Regex::Regex(const std::string& pattern, bool literal, const std::string& where) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  const uint32_t flags = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // LITERAL allows no UCP
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), flags,
                                   &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    MOESQ_FAIL(where, ": regex does not compile at offset ", err_off, ": ", reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is the fallback
  code_ = std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  auto* code = static_cast<pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  std::vector<std::pair<size_t, size_t>> out;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    // The text was validated once by the caller: skip PCRE2's per-call UTF check.
    const int rc = pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    MOESQ_CHECK(rc >= 0, "tokenizer: regex match failed (PCRE2 error ", rc, ")");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out.emplace_back(b, e);
      pos = e;
    } else {  // empty match: step over one character
      if (b >= s.size()) break;
      pos = b + std::max<size_t>(1, utf8_seq_len(s, b));
    }
  }
  return out;
}
#else
// Built without PCRE2 (CMake did not find libpcre2-8): tokenizer.json regexes cannot run.
Regex::Regex(const std::string&, bool, const std::string& where) {
  MOESQ_FAIL(where, ": this moesq was built without PCRE2, which tokenizer.json regexes need "
             "(install libpcre2-dev, e.g. scripts/install-deps.sh, and rebuild)");
}
std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view) const { return {}; }
#endif

namespace {

std::string replace_all(const Regex& re, std::string_view s, std::string_view content) {
  std::string out;
  size_t prev = 0;
  for (const auto& [b, e] : re.find_all(s)) {
    out.append(s.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(s.substr(prev));
  return out;
}

std::string nfc(const std::string& s) {
  bool ascii = true;
  for (const char c : s) ascii &= static_cast<uint8_t>(c) < 0x80;
  if (ascii) return s;  // ASCII is always NFC
#if MOESQ_HAVE_ICU
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  MOESQ_CHECK(U_SUCCESS(err), "tokenizer: ICU NFC normalizer unavailable (", u_errorName(err), ")");
  std::string out;
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(s.size()));
  n->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink, nullptr, err);
  MOESQ_CHECK(U_SUCCESS(err), "tokenizer: NFC normalization failed (", u_errorName(err), ")");
  return out;
#else
  MOESQ_FAIL("tokenizer: the NFC normalizer needs ICU, and this moesq was built without it "
             "(install libicu-dev, e.g. scripts/install-deps.sh, and rebuild)");
#endif
}

}  // namespace

// ---- normalizers ------------------------------------------------------------------------------

std::string normalize(const std::vector<Normalizer>& chain, std::string s) {
  for (const Normalizer& n : chain) {
    switch (n.kind) {
      case Normalizer::Kind::NFC: s = nfc(s); break;
      case Normalizer::Kind::Prepend:
        if (!s.empty()) s = n.content + s;  // tokenizers: Prepend leaves "" alone
        break;
      case Normalizer::Kind::Replace: s = replace_all(*n.pattern, s, n.content); break;
    }
  }
  return s;
}

// ---- pre-tokenizers ---------------------------------------------------------------------------

namespace {

using Piece = std::pair<std::string, bool>;  // (text, is_match)

// tokenizers NormalizedString::split: the matches and the gaps between them, then the behaviour.
std::vector<std::string> split(const Regex& re, PreTokenizer::Behavior behavior, const std::string& s) {
  std::vector<Piece> pieces;
  size_t prev = 0;
  for (const auto& [b, e] : re.find_all(s)) {
    if (b != prev) pieces.emplace_back(s.substr(prev, b - prev), false);
    pieces.emplace_back(s.substr(b, e - b), true);
    prev = e;
  }
  if (prev != s.size()) pieces.emplace_back(s.substr(prev), false);

  std::vector<std::string> out;
  using B = PreTokenizer::Behavior;
  if (behavior == B::Isolated || behavior == B::Removed) {
    for (auto& [text, is_match] : pieces) {
      if (!(behavior == B::Removed && is_match)) out.push_back(std::move(text));
    }
  } else if (behavior == B::MergedWithPrevious) {
    bool previous_match = false;
    for (auto& [text, is_match] : pieces) {
      if (is_match && !previous_match && !out.empty()) out.back() += text;
      else out.push_back(std::move(text));
      previous_match = is_match;
    }
  } else {  // MergedWithNext: the same, right to left
    bool previous_match = false;
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
      if (it->second && !previous_match && !out.empty()) out.back() = it->first + out.back();
      else out.push_back(std::move(it->first));
      previous_match = it->second;
    }
    std::reverse(out.begin(), out.end());
  }
  return out;
}

}  // namespace

std::vector<std::string> pre_tokenize(const std::vector<PreTokenizer>& chain, std::string s) {
  std::vector<std::string> words;
  if (!s.empty()) words.push_back(std::move(s));
  for (const PreTokenizer& p : chain) {
    std::vector<std::string> next;
    for (std::string& w : words) {
      if (p.kind == PreTokenizer::Kind::Split) {
        for (std::string& piece : split(*p.pattern, p.behavior, w)) next.push_back(std::move(piece));
        continue;
      }
      // ByteLevel: optional prefix space, optional GPT-2 regex split, then bytes → alphabet.
      if (p.add_prefix_space && w.front() != ' ') w.insert(w.begin(), ' ');
      std::vector<std::string> parts;
      if (p.pattern) parts = split(*p.pattern, PreTokenizer::Behavior::Isolated, w);
      else parts.push_back(std::move(w));
      for (const std::string& part : parts) {
        std::string mapped;
        mapped.reserve(part.size() * 2);
        for (const char c : part) mapped += byte_to_unicode()[static_cast<uint8_t>(c)];
        next.push_back(std::move(mapped));
      }
    }
    words.clear();
    for (std::string& w : next) {
      if (!w.empty()) words.push_back(std::move(w));  // tokenizers drops empty splits
    }
  }
  return words;
}

// ---- decoders ---------------------------------------------------------------------------------

namespace {

// "<0xNN>" → NN (tokenizers ByteFallback: exactly 6 bytes, hex digits of either case).
std::optional<uint8_t> byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return std::nullopt;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0) return std::nullopt;
    v = v * 16 + d;
  }
  return static_cast<uint8_t>(v);
}

std::vector<std::string> byte_fallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  std::string bytes;
  size_t num_bytes = 0;
  const auto flush = [&] {
    if (!num_bytes) return;
    if (utf8_first_invalid(bytes) == std::string_view::npos) {
      out.push_back(bytes);
    } else {
      for (size_t k = 0; k < num_bytes; ++k) out.emplace_back("\xEF\xBF\xBD");
    }
    bytes.clear();
    num_bytes = 0;
  };
  for (std::string& t : tokens) {
    if (const auto b = byte_token(t)) {
      bytes += static_cast<char>(*b);
      ++num_bytes;
      continue;
    }
    flush();
    out.push_back(std::move(t));
  }
  flush();
  return out;
}

std::string strip(const std::string& t, uint32_t content, int64_t start, int64_t stop) {
  std::vector<std::pair<size_t, size_t>> chars;  // byte ranges of the code points
  for (size_t i = 0; i < t.size();) {
    const size_t b = i;
    next_cp(t, i);
    chars.emplace_back(b, i);
  }
  const auto cp_at = [&](size_t k) {
    size_t i = chars[k].first;
    return next_cp(t, i);
  };
  size_t start_cut = 0, stop_cut = 0;
  for (size_t k = 0; k < chars.size() && static_cast<int64_t>(k) < start && cp_at(k) == content; ++k) start_cut = k + 1;
  for (size_t k = 0; k < chars.size() && static_cast<int64_t>(k) < stop && cp_at(chars.size() - 1 - k) == content; ++k)
    stop_cut = k + 1;
  // tokenizers takes (byte length − cuts) characters after the start cut.
  const size_t take = t.size() - start_cut - stop_cut;
  const size_t end_char = std::min(chars.size(), start_cut + take);
  if (start_cut >= end_char) return "";
  return t.substr(chars[start_cut].first, chars[end_char - 1].second - chars[start_cut].first);
}

}  // namespace

std::string decode_tokens(const std::vector<Decoder>& chain, std::vector<std::string> tokens) {
  for (const Decoder& d : chain) {
    switch (d.kind) {
      case Decoder::Kind::ByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) {
          std::string mapped;
          bool all = true;
          for (size_t i = 0; i < t.size() && all;) {
            const int b = unicode_to_byte(next_cp(t, i));
            if (b < 0) all = false;
            else mapped += static_cast<char>(b);
          }
          bytes += all ? mapped : t;  // a token outside the alphabet passes through as its bytes
        }
        tokens = {utf8_lossy(bytes)};
        break;
      }
      case Decoder::Kind::Replace:
        for (std::string& t : tokens) t = replace_all(*d.pattern, t, d.content);
        break;
      case Decoder::Kind::ByteFallback: tokens = byte_fallback(std::move(tokens)); break;
      case Decoder::Kind::Fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens = {all};
        break;
      }
      case Decoder::Kind::Strip: {
        size_t i = 0;
        const uint32_t c = next_cp(d.content, i);
        for (std::string& t : tokens) t = strip(t, c, d.start, d.stop);
        break;
      }
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace moesq::io::tok

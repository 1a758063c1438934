// tokenizer.json → Tokenizer::Impl: validates once, builds typed components (no JSON after load).
// Non-obvious decision: every `type` outside the supported list, and every option that would change
// the ids (truncation, padding, dropout, subword prefixes, single_word, Split invert), is refused
// with the JSON path of the field — a tokenizer that loads is one we reproduce exactly.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/tokenizer_parts.h"

namespace moesq::io {

namespace {

using nlohmann::json;

class Parser {
 public:
  explicit Parser(std::string source) : src_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    MOESQ_FAIL(src_, ": ", path, ": ", what);
  }
  [[noreturn]] void unsupported(const std::string& path, const std::string& type,
                                const char* supported) const {
    MOESQ_FAIL(src_, ": ", path, ".type \"", type, "\" is not supported (moesq reads: ", supported, ")");
  }

  const json& field(const json& obj, const char* key, const std::string& path) const {
    if (!obj.is_object()) fail(path, "expected an object");
    const auto it = obj.find(key);
    if (it == obj.end()) fail(path, std::string("missing key \"") + key + "\"");
    return *it;
  }
  std::string str(const json& obj, const char* key, const std::string& path) const {
    const json& v = field(obj, key, path);
    if (!v.is_string()) fail(path + "." + key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  bool flag(const json& obj, const char* key, const std::string& path, bool def) const {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return def;
    if (!it->is_boolean()) fail(path + "." + key, "expected true or false, got " + it->dump());
    return it->get<bool>();
  }
  int64_t integer(const json& obj, const char* key, const std::string& path) const {
    const json& v = field(obj, key, path);
    if (!v.is_number_integer()) fail(path + "." + key, "expected an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  std::string type(const json& obj, const std::string& path) const { return str(obj, "type", path); }
  // Null or absent, else an error naming what it would change.
  void require_null(const json& obj, const char* key, const std::string& path, const char* why) const {
    const auto it = obj.find(key);
    if (it != obj.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      fail(path + "." + key, std::string("is ") + it->dump() + "; moesq supports only null (" + why + ")");
  }
  // {"String": s} or {"Regex": r}.
  tok::Regex pattern(const json& obj, const std::string& path) const {
    const json& p = field(obj, "pattern", path);
    const std::string where = src_ + ": " + path + ".pattern";
    if (p.is_object() && p.size() == 1 && p.contains("String") && p["String"].is_string())
      return tok::Regex(p["String"].get<std::string>(), /*literal=*/true, where);
    if (p.is_object() && p.size() == 1 && p.contains("Regex") && p["Regex"].is_string())
      return tok::Regex(p["Regex"].get<std::string>(), /*literal=*/false, where);
    fail(path + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}, got " + p.dump());
  }

  void normalizer(const json& j, const std::string& path, std::vector<tok::Normalizer>& out) const {
    if (j.is_null()) return;
    const std::string t = type(j, path);
    using K = tok::Normalizer::Kind;
    if (t == "Sequence") {
      const json& list = field(j, "normalizers", path);
      if (!list.is_array()) fail(path + ".normalizers", "expected a list");
      for (size_t i = 0; i < list.size(); ++i)
        normalizer(list[i], path + ".normalizers[" + std::to_string(i) + "]", out);
    } else if (t == "NFC") {
      out.push_back({K::NFC, "", std::nullopt});
    } else if (t == "Prepend") {
      out.push_back({K::Prepend, str(j, "prepend", path), std::nullopt});
    } else if (t == "Replace") {
      out.push_back({K::Replace, str(j, "content", path), pattern(j, path)});
    } else {
      unsupported(path, t, "NFC, Prepend, Replace, Sequence");
    }
  }

  void pre_tokenizer(const json& j, const std::string& path, std::vector<tok::PreTokenizer>& out) const {
    if (j.is_null()) return;
    const std::string t = type(j, path);
    using K = tok::PreTokenizer::Kind;
    using B = tok::PreTokenizer::Behavior;
    if (t == "Sequence") {
      const json& list = field(j, "pretokenizers", path);
      if (!list.is_array()) fail(path + ".pretokenizers", "expected a list");
      for (size_t i = 0; i < list.size(); ++i)
        pre_tokenizer(list[i], path + ".pretokenizers[" + std::to_string(i) + "]", out);
    } else if (t == "Split") {
      if (flag(j, "invert", path, false)) fail(path + ".invert", "true is not supported");
      const std::string b = str(j, "behavior", path);
      B behavior;
      if (b == "Isolated") behavior = B::Isolated;
      else if (b == "Removed") behavior = B::Removed;
      else if (b == "MergedWithPrevious") behavior = B::MergedWithPrevious;
      else if (b == "MergedWithNext") behavior = B::MergedWithNext;
      else fail(path + ".behavior", "\"" + b + "\" is not supported (Isolated, Removed, MergedWithPrevious, MergedWithNext)");
      out.push_back({K::Split, behavior, pattern(j, path), false});
    } else if (t == "ByteLevel") {
      // The GPT-2 pattern the library's ByteLevel uses when use_regex is true (its default).
      static const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
      std::optional<tok::Regex> re;
      if (flag(j, "use_regex", path, true)) re.emplace(kGpt2, false, src_ + ": " + path);
      out.push_back({K::ByteLevel, B::Isolated, std::move(re), flag(j, "add_prefix_space", path, true)});
    } else {
      unsupported(path, t, "Split, ByteLevel, Sequence");
    }
  }

  void decoder(const json& j, const std::string& path, std::vector<tok::Decoder>& out) const {
    const std::string t = type(j, path);
    using K = tok::Decoder::Kind;
    if (t == "Sequence") {
      const json& list = field(j, "decoders", path);
      if (!list.is_array()) fail(path + ".decoders", "expected a list");
      for (size_t i = 0; i < list.size(); ++i) decoder(list[i], path + ".decoders[" + std::to_string(i) + "]", out);
    } else if (t == "ByteLevel") {
      out.push_back({K::ByteLevel, std::nullopt, "", 0, 0});
    } else if (t == "Replace") {
      out.push_back({K::Replace, pattern(j, path), str(j, "content", path), 0, 0});
    } else if (t == "ByteFallback") {
      out.push_back({K::ByteFallback, std::nullopt, "", 0, 0});
    } else if (t == "Fuse") {
      out.push_back({K::Fuse, std::nullopt, "", 0, 0});
    } else if (t == "Strip") {
      const std::string c = str(j, "content", path);
      if (c.empty() || tok::utf8_seq_len(c, 0) != c.size()) fail(path + ".content", "expected one character");
      const int64_t start = integer(j, "start", path), stop = integer(j, "stop", path);
      if (start < 0 || stop < 0) fail(path, "start and stop must be >= 0");
      out.push_back({K::Strip, std::nullopt, c, start, stop});
    } else {
      unsupported(path, t, "ByteLevel, Replace, ByteFallback, Fuse, Strip, Sequence");
    }
  }

  void model(const json& j, Tokenizer::Impl& impl) const {
    const std::string path = "model";
    if (!j.is_object()) fail(path, "expected an object");
    const std::string t = j.contains("type") ? type(j, path) : "BPE";  // old files omit it
    if (t != "BPE") unsupported(path, t, "BPE");
    tok::Bpe& bpe = impl.bpe;
    if (const auto it = j.find("dropout"); it != j.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0.0))
      fail(path + ".dropout", "is " + it->dump() + "; moesq supports only null (deterministic encoding)");
    require_null(j, "continuing_subword_prefix", path, "no subword prefixes");
    require_null(j, "end_of_word_suffix", path, "no word suffixes");
    bpe.fuse_unk = flag(j, "fuse_unk", path, false);
    bpe.byte_fallback = flag(j, "byte_fallback", path, false);
    bpe.ignore_merges = flag(j, "ignore_merges", path, false);

    const json& vocab = field(j, "vocab", path);
    if (!vocab.is_object()) fail(path + ".vocab", "expected an object {token: id}");
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
        fail(path + ".vocab[\"" + it.key() + "\"]", "expected an id >= 0, got " + it.value().dump());
      const int32_t id = it.value().get<int32_t>();
      bpe.vocab.emplace(it.key(), id);
      bpe.id_to_token[id] = it.key();  // two tokens with one id: the later key (sorted order) wins
      bpe.id_end = std::max<int64_t>(bpe.id_end, int64_t{id} + 1);
    }

    if (const auto it = j.find("unk_token"); it != j.end() && !it->is_null()) {
      if (!it->is_string()) fail(path + ".unk_token", "expected a string or null");
      const auto v = bpe.vocab.find(it->get<std::string>());
      if (v == bpe.vocab.end()) fail(path + ".unk_token", "\"" + it->get<std::string>() + "\" is not in model.vocab");
      bpe.unk_id = v->second;
    }
    bpe.byte_ids.fill(-1);
    if (bpe.byte_fallback) {
      static const char* kHex = "0123456789ABCDEF";
      for (int b = 0; b < 256; ++b) {
        const std::string name = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
        if (const auto v = bpe.vocab.find(name); v != bpe.vocab.end()) bpe.byte_ids[b] = v->second;
      }
    }

    const json& merges = field(j, "merges", path);
    if (!merges.is_array()) fail(path + ".merges", "expected a list");
    for (size_t r = 0; r < merges.size(); ++r) {
      const json& m = merges[r];
      const std::string mpath = path + ".merges[" + std::to_string(r) + "]";
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail(mpath, "expected \"A B\" (two tokens, one space), got " + m.dump());
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>(), b = m[1].get<std::string>();
      } else {
        fail(mpath, "expected \"A B\" or [A, B], got " + m.dump());
      }
      const auto ia = bpe.vocab.find(a), ib = bpe.vocab.find(b), iab = bpe.vocab.find(a + b);
      if (ia == bpe.vocab.end()) fail(mpath, "token \"" + a + "\" is not in model.vocab");
      if (ib == bpe.vocab.end()) fail(mpath, "token \"" + b + "\" is not in model.vocab");
      if (iab == bpe.vocab.end()) fail(mpath, "merged token \"" + a + b + "\" is not in model.vocab");
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                           static_cast<uint32_t>(ib->second);
      bpe.merges[key] = {static_cast<int32_t>(r), iab->second};  // a repeated pair: the last rank wins
    }
  }

  void added_tokens(const json& j, Tokenizer::Impl& impl) const {
    if (j.is_null()) return;
    if (!j.is_array()) fail("added_tokens", "expected a list");
    for (size_t i = 0; i < j.size(); ++i) {
      const std::string path = "added_tokens[" + std::to_string(i) + "]";
      Tokenizer::Impl::AddedToken t;
      const int64_t id = integer(j[i], "id", path);
      if (id < 0 || id > INT32_MAX) fail(path + ".id", "expected an id >= 0");
      t.id = static_cast<int32_t>(id);
      t.content = str(j[i], "content", path);
      if (t.content.empty()) fail(path + ".content", "is empty");
      t.special = flag(j[i], "special", path, false);
      t.normalized = flag(j[i], "normalized", path, !t.special);  // the library's default
      t.lstrip = flag(j[i], "lstrip", path, false);
      t.rstrip = flag(j[i], "rstrip", path, false);
      if (flag(j[i], "single_word", path, false)) fail(path + ".single_word", "true is not supported");
      impl.added_by_id[t.id] = impl.added.size();
      impl.added_by_content[t.content] = impl.added.size();
      impl.added_by_first_byte[static_cast<uint8_t>(t.content[0])].push_back(impl.added.size());
      impl.added.push_back(std::move(t));
    }
  }

  // Items of a TemplateProcessing "single" template; `path` = its JSON path.
  void post_processor(const json& j, const std::string& path, Tokenizer::Impl& impl) const {
    if (j.is_null()) return;
    const std::string t = type(j, path);
    if (t == "ByteLevel") return;  // offsets only: the ids are unchanged
    if (t == "Sequence") {
      const json& list = field(j, "processors", path);
      if (!list.is_array()) fail(path + ".processors", "expected a list");
      for (size_t i = 0; i < list.size(); ++i)
        post_processor(list[i], path + ".processors[" + std::to_string(i) + "]", impl);
      return;
    }
    if (t != "TemplateProcessing") unsupported(path, t, "TemplateProcessing, ByteLevel, Sequence");
    if (!impl.template_single.empty()) fail(path, "a second TemplateProcessing is not supported");
    const json& specials = field(j, "special_tokens", path);
    const json& single = field(j, "single", path);
    if (!single.is_array()) fail(path + ".single", "expected a list");
    bool saw_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string ipath = path + ".single[" + std::to_string(i) + "]";
      const json& item = single[i];
      if (item.is_object() && item.contains("Sequence")) {
        const std::string id = str(item["Sequence"], "id", ipath + ".Sequence");
        if (id != "A") fail(ipath + ".Sequence.id", "expected \"A\" in a single template, got \"" + id + "\"");
        impl.template_single.emplace_back(std::nullopt);
        saw_sequence = true;
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name = str(item["SpecialToken"], "id", ipath + ".SpecialToken");
        if (!specials.is_object() || !specials.contains(name))
          fail(ipath + ".SpecialToken.id", "\"" + name + "\" is not in " + path + ".special_tokens");
        const json& ids = field(specials[name], "ids", path + ".special_tokens[\"" + name + "\"]");
        std::vector<int32_t> v;
        for (const json& x : ids) {
          if (!x.is_number_integer() || x.get<int64_t>() < 0)
            fail(path + ".special_tokens[\"" + name + "\"].ids", "expected ids >= 0, got " + ids.dump());
          v.push_back(x.get<int32_t>());
        }
        impl.template_single.emplace_back(std::move(v));
      } else {
        fail(ipath, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " + item.dump());
      }
    }
    if (!saw_sequence) fail(path + ".single", "has no {\"Sequence\": {\"id\": \"A\"}} item");
  }

  std::shared_ptr<Tokenizer::Impl> parse(std::string_view text) const {
    json j;
    try {
      j = json::parse(text);
    } catch (const json::parse_error& e) {
      MOESQ_FAIL(src_, ": not valid JSON (", e.what(), ")");
    }
    if (!j.is_object()) MOESQ_FAIL(src_, ": expected a JSON object (a Hugging Face tokenizer.json)");
    auto impl = std::make_shared<Tokenizer::Impl>();
    impl->source = src_;
    require_null(j, "truncation", "tokenizer", "truncation would cut the ids");
    require_null(j, "padding", "tokenizer", "padding would add ids");
    model(field(j, "model", "tokenizer"), *impl);
    added_tokens(j.value("added_tokens", json()), *impl);
    normalizer(j.value("normalizer", json()), "normalizer", impl->normalizers);
    pre_tokenizer(j.value("pre_tokenizer", json()), "pre_tokenizer", impl->pre_tokenizers);
    post_processor(j.value("post_processor", json()), "post_processor", *impl);
    const json dec = j.value("decoder", json());
    impl->has_decoder = !dec.is_null();
    if (impl->has_decoder) decoder(dec, "decoder", impl->decoders);

    bool byte_level = false;
    for (const auto& p : impl->pre_tokenizers) byte_level |= p.kind == tok::PreTokenizer::Kind::ByteLevel;
    impl->summary = std::string("BPE") + (byte_level ? ", byte-level" : "") +
                    (impl->bpe.byte_fallback ? ", byte fallback" : "");
    return impl;
  }

 private:
  std::string src_;
};

}  // namespace

std::shared_ptr<Tokenizer::Impl> parse_tokenizer_json(std::string_view json_text, const std::string& source) {
  return Parser(source).parse(json_text);
}

}  // namespace moesq::io

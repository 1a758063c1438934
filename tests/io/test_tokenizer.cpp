// io::Tokenizer against the `tokenizers` library: every case of both fixtures'
// reference_encodings.json (ids with the post-processor, ids without it, decode), 500 stress cases
// per tokenizer from tokenizers trained by the library (fixtures/tokenizers/stress), the heap BPE
// against a plain-loop `_ref` BPE, the byte identity, and the refusal paths (unsupported component,
// malformed merges, missing/invalid files, bad ids) whose messages must name the file and JSON path.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_parts.h"
#include "support/temp_dir.h"

namespace {

using moesq::io::Tokenizer;
using nlohmann::json;

const std::string kQwen = std::string(MOESQ_FIXTURES) + "/tokenizers/bpe-bytelevel-qwen-style";
const std::string kMistral = std::string(MOESQ_FIXTURES) + "/tokenizers/bpe-bytefallback-mistral-style";
constexpr size_t kNumReferenceCases = 17;  // per fixture (README of the fixtures)

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Case {
  std::string text, decoded;
  std::vector<int32_t> ids;
};

std::vector<Case> reference_cases(const std::string& dir) {
  const json j = json::parse(slurp(dir + "/reference_encodings.json"));
  std::vector<Case> cases;
  for (const json& c : j) cases.push_back({c["text"], c["decoded"], c["ids"].get<std::vector<int32_t>>()});
  return cases;
}

// "case 3 (Ünïcödé …): first difference at index 5: got 12, want 13 (sizes 40 vs 41)"
std::string first_difference(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::ostringstream os;
  os << "first difference at index " << i << ": got "
     << (i < got.size() ? std::to_string(got[i]) : "end") << ", want "
     << (i < want.size() ? std::to_string(want[i]) : "end") << " (sizes " << got.size() << " vs "
     << want.size() << ")";
  return os.str();
}

// Every reference case: ids with the post-processor, ids without it (the template's BOS, if any,
// removed), and decode(ids) — counted so the failure says how many of the 17 match.
void check_reference(const std::string& dir, size_t num_bos) {
  const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  const std::vector<Case> cases = reference_cases(dir);
  ASSERT_EQ(cases.size(), kNumReferenceCases);
  size_t encode_ok = 0, plain_ok = 0, decode_ok = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    const std::string label = "case " + std::to_string(k) + " (" + c.text.substr(0, 30) + ")";
    const std::vector<int32_t> got = tok.encode(c.text);
    if (got == c.ids) ++encode_ok;
    else ADD_FAILURE() << label << ": encode " << first_difference(got, c.ids);

    ASSERT_GE(c.ids.size(), num_bos);
    const std::vector<int32_t> want_plain(c.ids.begin() + static_cast<std::ptrdiff_t>(num_bos), c.ids.end());
    const std::vector<int32_t> plain = tok.encode(c.text, {.add_special_tokens = false});
    if (plain == want_plain) ++plain_ok;
    else ADD_FAILURE() << label << ": encode without special tokens " << first_difference(plain, want_plain);

    const std::string decoded = tok.decode(c.ids);
    if (decoded == c.decoded) ++decode_ok;
    else ADD_FAILURE() << label << ": decode got \"" << decoded << "\", want \"" << c.decoded << "\"";
  }
  EXPECT_EQ(encode_ok, cases.size());
  EXPECT_EQ(plain_ok, cases.size());
  EXPECT_EQ(decode_ok, cases.size());
  std::printf("%s: %zu/%zu encode, %zu/%zu encode without special tokens, %zu/%zu decode match\n",
              dir.c_str(), encode_ok, cases.size(), plain_ok, cases.size(), decode_ok, cases.size());
}

TEST(Tokenizer, QwenStyleByteLevelMatchesReference) { check_reference(kQwen, 0); }
TEST(Tokenizer, MistralStyleByteFallbackMatchesReference) { check_reference(kMistral, 1); }

// Tokenizers trained by the library on the GPU machine, 300 awkward short strings and 200 random id
// lists each (tests/fixtures/tokenizers/stress/README.md); decode is the Python default,
// skip_special_tokens=True.
void check_stress(const std::string& dir) {
  const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  const json cases = json::parse(slurp(dir + "/stress_encodings.json"));
  ASSERT_EQ(cases.size(), 500u);
  size_t ok = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const json& c = cases[k];
    const std::vector<int32_t> ids = c["ids"];
    bool same = tok.decode(ids, {.skip_special_tokens = true}) == c["decoded_skip_special"].get<std::string>();
    if (c.contains("text")) {
      const std::string text = c["text"];
      const std::vector<int32_t> got = tok.encode(text), plain = tok.encode(text, {.add_special_tokens = false});
      same = same && got == ids && plain == c["ids_no_special"].get<std::vector<int32_t>>();
      if (got != ids) ADD_FAILURE() << "stress case " << k << " " << c["text"].dump() << ": " << first_difference(got, ids);
    }
    if (same) ++ok;
    else ADD_FAILURE() << "stress case " << k << " differs";
  }
  EXPECT_EQ(ok, cases.size());
  std::printf("%s: %zu/%zu stress cases match\n", dir.c_str(), ok, cases.size());
}

const std::string kStress = std::string(MOESQ_FIXTURES) + "/tokenizers/stress";
TEST(Tokenizer, TrainedByteLevelStressCasesMatchLibrary) { check_stress(kStress + "/bytelevel"); }
TEST(Tokenizer, TrainedByteFallbackStressCasesMatchLibrary) { check_stress(kStress + "/bytefallback"); }

TEST(Tokenizer, VocabularyAndSpecialTokens) {
  const Tokenizer qwen = moesq::io::load_tokenizer(kQwen);  // a directory works too
  EXPECT_EQ(qwen.vocab_size(), 3000);
  EXPECT_EQ(qwen.token_to_id("<|im_end|>"), 2);
  EXPECT_EQ(qwen.id_to_token(0), "<|endoftext|>");
  EXPECT_FALSE(qwen.id_to_token(3000).has_value());
  EXPECT_FALSE(qwen.is_byte_identity());
  // Special tokens in the text are matched; the ByteLevel post-processor adds nothing.
  EXPECT_EQ(qwen.encode("<|im_start|><|im_end|>"), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(qwen.decode(std::vector<int32_t>{1, 404, 270, 2}, {.skip_special_tokens = true}), "user");

  const Tokenizer mistral = Tokenizer::from_file(kMistral + "/tokenizer.json");
  EXPECT_EQ(mistral.vocab_size(), 3000);
  EXPECT_EQ(mistral.token_to_id("<0x41>"), 3 + 0x41);
  EXPECT_EQ(mistral.encode(""), (std::vector<int32_t>{1}));  // BOS even for empty text
  EXPECT_TRUE(mistral.encode("", {.add_special_tokens = false}).empty());
}

// skip_special_tokens: Mistral's Strip decoder then removes the prefix space, giving back the text —
// for cases without byte-fallback ids (those are special added tokens in this file, so they are
// skipped too, exactly as the library does).
TEST(Tokenizer, MistralSkipSpecialGivesBackText) {
  const Tokenizer tok = Tokenizer::from_file(kMistral + "/tokenizer.json");
  size_t checked = 0;
  for (const Case& c : reference_cases(kMistral)) {
    if (std::any_of(c.ids.begin() + 1, c.ids.end(), [](int32_t id) { return id < 259; })) continue;
    EXPECT_EQ(tok.decode(c.ids, {.skip_special_tokens = true}), c.text);
    ++checked;
  }
  EXPECT_GE(checked, 5u);
}

TEST(Tokenizer, ByteIdentityRoundTripsEveryByte) {
  const Tokenizer tok = Tokenizer::byte_identity();
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[static_cast<size_t>(b)], b);
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_EQ(tok.vocab_size(), 256);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{256}), moesq::Error);
}

TEST(Tokenizer, CheckpointLoaderFallsBackToByteIdentityOnlyForVocab256) {
  EXPECT_TRUE(moesq::io::load_tokenizer_for_checkpoint(MOESQ_DEFAULT_MODEL).is_byte_identity());
  moesq::test::TempDir dir("moesq_test_tok");
  dir.write("config.json", R"({"vocab_size": 151936})");
  try {
    moesq::io::load_tokenizer_for_checkpoint(dir.path.string());
    FAIL() << "expected an error";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size is 151936"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir.path.string()), std::string::npos) << e.what();
  }
  dir.write("tokenizer.json", slurp(kQwen + "/tokenizer.json"));
  EXPECT_EQ(moesq::io::load_tokenizer_for_checkpoint(dir.path.string()).vocab_size(), 3000);
}

// Added-token flags the fixtures leave false: lstrip/rstrip absorb the whitespace beside the token.
TEST(Tokenizer, AddedTokenStripFlags) {
  json j = json::parse(slurp(kQwen + "/tokenizer.json"));
  j["added_tokens"][2]["lstrip"] = true;  // <|im_end|>
  j["added_tokens"][1]["rstrip"] = true;  // <|im_start|>
  const Tokenizer tok = Tokenizer::from_json_text(j.dump(), "modified.json");
  const Tokenizer plain = Tokenizer::from_file(kQwen + "/tokenizer.json");
  EXPECT_EQ(tok.encode("hi  <|im_end|>"), plain.encode("hi<|im_end|>"));
  EXPECT_EQ(tok.encode("<|im_start|> \n hi"), plain.encode("<|im_start|>hi"));
}

// ---- heap BPE vs the plain-loop reference ------------------------------------------------------

// Textbook BPE: repeatedly merge the lowest-rank adjacent pair, leftmost first.
std::vector<int32_t> bpe_ref(const moesq::io::tok::Bpe& bpe, const std::vector<int32_t>& chars) {
  std::vector<int32_t> s = chars;
  for (;;) {
    int32_t best_rank = INT32_MAX, best_id = -1;
    size_t best_pos = 0;
    for (size_t k = 0; k + 1 < s.size(); ++k) {
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(s[k])) << 32) | static_cast<uint32_t>(s[k + 1]);
      const auto it = bpe.merges.find(key);
      if (it != bpe.merges.end() && it->second.first < best_rank)
        best_rank = it->second.first, best_id = it->second.second, best_pos = k;
    }
    if (best_id < 0) return s;
    s[best_pos] = best_id;
    s.erase(s.begin() + static_cast<std::ptrdiff_t>(best_pos) + 1);
  }
}

TEST(Tokenizer, HeapBpeMatchesPlainLoopReference) {
  // The Mistral-style model has no pre-tokenizer: long words, many competing merges.
  const json j = json::parse(slurp(kMistral + "/tokenizer.json"));
  moesq::io::tok::Bpe bpe;
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it)
    bpe.vocab.emplace(it.key(), it.value().get<int32_t>());
  int32_t rank = 0;
  for (const json& m : j["model"]["merges"]) {
    const std::string a = m[0], b = m[1];
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(bpe.vocab.at(a))) << 32) |
                         static_cast<uint32_t>(bpe.vocab.at(b));
    bpe.merges[key] = {rank++, bpe.vocab.at(a + b)};
  }
  bpe.byte_ids.fill(-1);
  const std::vector<std::string> alphabet = {"▁", "e", "t", "h", "a", "n", "s", "r", "o", "i", "l", "d"};
  std::mt19937 rng(1234);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1), length(1, 300);
  for (int trial = 0; trial < 200; ++trial) {
    std::string word;
    std::vector<int32_t> chars;
    const size_t len = length(rng);
    for (size_t k = 0; k < len; ++k) {
      const std::string& c = alphabet[pick(rng)];
      word += c;
      chars.push_back(bpe.vocab.at(c));
    }
    std::vector<int32_t> got;
    bpe.tokenize(word, got);
    ASSERT_EQ(got, bpe_ref(bpe, chars)) << "trial " << trial << ", word of " << len << " characters: " << word;
  }
}

// ---- refusals ----------------------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const moesq::Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string load_error(const json& j) {
  return error_of([&] { Tokenizer::from_json_text(j.dump(), "tokenizer.json"); });
}

TEST(Tokenizer, RefusesUnsupportedComponentsNamingPathAndType) {
  const json base = json::parse(slurp(kQwen + "/tokenizer.json"));
  json j = base;
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(load_error(j).rfind(R"(tokenizer.json: normalizer.type "NFKC" is not supported)", 0), 0u) << load_error(j);

  j = base;
  j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Metaspace"}};
  EXPECT_NE(load_error(j).find(R"(pre_tokenizer.pretokenizers[1].type "Metaspace" is not supported)"), std::string::npos)
      << load_error(j);

  j = base;
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(load_error(j).find(R"(model.type "WordPiece" is not supported)"), std::string::npos) << load_error(j);

  j = json::parse(slurp(kMistral + "/tokenizer.json"));
  j["decoder"]["decoders"][2] = {{"type", "CTC"}};
  EXPECT_NE(load_error(j).find(R"(decoder.decoders[2].type "CTC" is not supported)"), std::string::npos) << load_error(j);

  j = base;
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  EXPECT_NE(load_error(j).find(R"(post_processor.type "RobertaProcessing" is not supported)"), std::string::npos);

  j = base;
  j["truncation"] = {{"max_length", 8}};
  EXPECT_NE(load_error(j).find("tokenizer.truncation"), std::string::npos) << load_error(j);

  j = base;
  j["added_tokens"][0]["single_word"] = true;
  EXPECT_NE(load_error(j).find("added_tokens[0].single_word"), std::string::npos) << load_error(j);

  j = base;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}};
  EXPECT_NE(load_error(j).find("pre_tokenizer.pretokenizers[0].pattern: regex does not compile"), std::string::npos)
      << load_error(j);
}

TEST(Tokenizer, RefusesMalformedMerges) {
  const json base = json::parse(slurp(kQwen + "/tokenizer.json"));
  json j = base;
  j["model"]["merges"][3] = "Ġ";  // no space
  EXPECT_NE(load_error(j).find("model.merges[3]: expected \"A B\""), std::string::npos) << load_error(j);
  j = base;
  j["model"]["merges"][4] = json::array({1, 2});
  EXPECT_NE(load_error(j).find("model.merges[4]: expected \"A B\" or [A, B]"), std::string::npos) << load_error(j);
  j = base;
  j["model"]["merges"][5] = json::array({"not-a-token", "t"});
  EXPECT_NE(load_error(j).find("model.merges[5]: token \"not-a-token\" is not in model.vocab"), std::string::npos)
      << load_error(j);
  j = base;
  j["model"]["merges"] = json::array({"h e"});  // the string form works too
  EXPECT_EQ(load_error(j), "(no error)");
  j = base;
  j["model"].erase("vocab");
  EXPECT_NE(load_error(j).find("model: missing key \"vocab\""), std::string::npos) << load_error(j);
}

TEST(Tokenizer, FileErrorsNameTheFile) {
  moesq::test::TempDir dir("moesq_test_tok");
  const std::string missing = dir.file("nope.json");
  EXPECT_NE(error_of([&] { Tokenizer::from_file(missing); }).find(missing + ": no such file"), std::string::npos);
  const std::string bad = dir.write("bad.json", "{\"model\": ");
  EXPECT_NE(error_of([&] { Tokenizer::from_file(bad); }).find(bad + ": not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([&] { moesq::io::load_tokenizer(dir.path.string()); }).find("no tokenizer.json"),
            std::string::npos);
}

TEST(Tokenizer, RefusesBadInputAndIds) {
  const Tokenizer tok = Tokenizer::from_file(kQwen + "/tokenizer.json");
  EXPECT_NE(error_of([&] { tok.encode("ok\xC3(bad"); }).find("not valid UTF-8 (byte offset 2)"), std::string::npos);
  EXPECT_NE(error_of([&] { tok.decode(std::vector<int32_t>{42, 3000}); }).find("id 3000 at position 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tok.decode(std::vector<int32_t>{-1}); }).find("id -1 at position 0"), std::string::npos);
}

// Vocabulary ids are the file's: one of 2^31 - 1 (or 2e9) once sized a table max id + 1 long and ended
// in `internal error` (vector larger than max_size / bad_alloc). A sparse id space loads, encodes and
// decodes like the dense one, and vocab_size is the largest id + 1.
TEST(Tokenizer, HugeSparseVocabIdsLoadWithoutATableOfThatSize) {
  const json base = json::parse(slurp(kQwen + "/tokenizer.json"));
  const Tokenizer dense = Tokenizer::from_json_text(base.dump(), "tokenizer.json");
  for (const int64_t big : {int64_t{INT32_MAX}, int64_t{2000000000}}) {
    json j = base;
    j["model"]["vocab"]["moesq-sparse-id"] = big;
    const Tokenizer tok = Tokenizer::from_json_text(j.dump(), "tokenizer.json");
    EXPECT_EQ(tok.vocab_size(), std::max<int64_t>(big + 1, dense.vocab_size())) << big;
    EXPECT_EQ(tok.id_to_token(static_cast<int32_t>(big)).value_or("(none)"), "moesq-sparse-id") << big;
    const std::string text = "hello world, the sparse ids change nothing";
    EXPECT_EQ(tok.encode(text), dense.encode(text)) << big;
    EXPECT_EQ(tok.decode(tok.encode(text)), text) << big;
    EXPECT_NE(error_of([&] { tok.decode(std::vector<int32_t>{static_cast<int32_t>(big - 1)}); }).find("is not in the vocabulary"),
              std::string::npos) << big;
  }
  json j = base;
  j["model"]["vocab"]["too-big"] = int64_t{INT32_MAX} + 1;
  EXPECT_NE(load_error(j).find(R"(model.vocab["too-big"]: expected an id >= 0)"), std::string::npos) << load_error(j);
}

// Decode of byte runs that are not UTF-8: one U+FFFD per maximal invalid subpart (ByteLevel) or
// per byte (ByteFallback), as the library does.
TEST(Tokenizer, InvalidByteRunsDecodeToReplacementCharacters) {
  const Tokenizer mistral = Tokenizer::from_file(kMistral + "/tokenizer.json");
  const int32_t c3 = 3 + 0xC3, a9 = 3 + 0xA9;
  EXPECT_EQ(mistral.decode(std::vector<int32_t>{c3, a9}), "é");
  EXPECT_EQ(mistral.decode(std::vector<int32_t>{c3, c3}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(moesq::io::tok::utf8_lossy("a\xE2\x82(b"), "a\xEF\xBF\xBD(b");  // E2 82 is one subpart
}

}  // namespace

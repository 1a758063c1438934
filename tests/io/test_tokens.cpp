// Token loading: text bytes as tokens with the 98 % / 2 % split, .npy int32/uint32 in 1-D and 2-D
// (written here byte by byte in numpy's own format, v1 and v2 headers), malformed .npy headers,
// ids outside the vocabulary, empty files, and window cutting.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/error.h"
#include "io/tokens.h"

#include "support/temp_dir.h"

namespace fs = std::filesystem;
using moesq::Error;
using namespace moesq::io;

namespace {

using moesq::test::TempDir;

// numpy.save's format: magic, version, header length, dict padded with spaces to a multiple of 64
// ending in '\n', then little-endian data.
std::string npy(const std::string& descr, const std::string& shape, const std::vector<uint32_t>& values,
                int version = 1, bool fortran = false) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                     ", 'shape': " + shape + ", }";
  const size_t prefix = version == 1 ? 10 : 12;
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  const uint32_t len = static_cast<uint32_t>(dict.size());
  out.append(reinterpret_cast<const char*>(&len), version == 1 ? 2 : 4);
  out += dict;
  for (uint32_t v : values) out.append(reinterpret_cast<const char*>(&v), 4);
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<uint32_t> random_ids(std::mt19937& rng, size_t n, uint32_t vocab) {
  std::vector<uint32_t> v(n);
  for (auto& x : v) x = rng() % vocab;
  return v;
}

}  // namespace

TEST(Tokens, TextBytesAndSplit) {
  TempDir dir;
  std::mt19937 rng(17);
  for (size_t size : {1000u, 4099u, 51u}) {
    std::string text(size, '\0');
    for (auto& c : text) c = static_cast<char>(1 + rng() % 255);  // every byte but NUL (not text: refused)
    const std::string path = dir.write("t" + std::to_string(size) + ".txt", text);
    const auto all = load_tokens(path, 256);
    ASSERT_EQ(all.size(), size);
    for (size_t i = 0; i < size; ++i) ASSERT_EQ(all[i], static_cast<unsigned char>(text[i]));
    const auto train = load_tokens(path, 256, TextSplit::Train);
    const auto held = load_tokens(path, 256, TextSplit::Heldout);
    // floor(0.98 · size), e.g. 1000 → 980, 4099 → 4017, 51 → 49.
    const size_t cut = static_cast<size_t>(std::floor(0.98L * static_cast<long double>(size)));
    EXPECT_EQ(train.size(), cut) << size;
    EXPECT_EQ(train.size() + held.size(), size);
    EXPECT_TRUE(std::equal(train.begin(), train.end(), all.begin()));
    EXPECT_TRUE(std::equal(held.begin(), held.end(), all.begin() + static_cast<long>(cut)));
  }
}

TEST(Tokens, TextBytesOutsideVocab) {
  TempDir dir;
  const std::string path = dir.write("hi.txt", "abc\xff");
  EXPECT_EQ(load_tokens(path, 256).size(), 4u);
  const std::string msg = error_of([&] { load_tokens(path, 128); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("255"), std::string::npos) << msg;
}

TEST(Tokens, BinaryFileReadAsTextIsRefused) {
  TempDir dir;
  // the first bytes of a .safetensors file: an 8-byte little-endian header length, then JSON
  const std::string path = dir.write("model.safetensors", std::string("\x10\0\0\0\0\0\0\0{\"a\":1}", 16));
  const std::string msg = error_of([&] { load_tokens(path, 256); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("is not text: NUL byte at offset 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find(".npy"), std::string::npos) << msg;
  EXPECT_EQ(load_tokens(dir.write("ok.txt", "no nul here"), 256).size(), 11u);
}

TEST(Tokens, NpyInt32AndUint32) {
  TempDir dir;
  std::mt19937 rng(4);
  const auto ids = random_ids(rng, 6 * 37, 1000);
  for (const char* descr : {"<i4", "<u4"}) {
    for (int version : {1, 2}) {
      const std::string tag = std::string(descr + 1) + "_v" + std::to_string(version);
      const std::string p1 = dir.write("a_" + tag + ".npy", npy(descr, "(222,)", ids, version));
      const std::string p2 = dir.write("b_" + tag + ".npy", npy(descr, "(6, 37)", ids, version));
      for (const auto& p : {p1, p2}) {
        const auto got = load_tokens(p, 1000);
        ASSERT_EQ(got.size(), ids.size()) << p;
        for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(got[i], static_cast<int32_t>(ids[i])) << p << " " << i;
      }
      const auto held = load_tokens(p2, 1000, TextSplit::Heldout);
      EXPECT_EQ(held.size(), ids.size() - ids.size() * 98 / 100);
      EXPECT_EQ(held.back(), static_cast<int32_t>(ids.back()));
    }
  }
}

TEST(Tokens, NpyIdsOutsideVocab) {
  TempDir dir;
  const std::string big = dir.write("big.npy", npy("<u4", "(3,)", {1, 2, 300}));
  std::string msg = error_of([&] { load_tokens(big, 256); });
  EXPECT_NE(msg.find(big), std::string::npos) << msg;
  EXPECT_NE(msg.find("300"), std::string::npos) << msg;
  const std::string neg = dir.write("neg.npy", npy("<i4", "(2,)", {5, 0xffffffffu}));
  msg = error_of([&] { load_tokens(neg, 256); });
  EXPECT_NE(msg.find("-1"), std::string::npos) << msg;
  // The same bits are a valid uint32 id... beyond any vocabulary here.
  const std::string u = dir.write("u.npy", npy("<u4", "(2,)", {5, 0xffffffffu}));
  EXPECT_NE(error_of([&] { load_tokens(u, 256); }).find("4294967295"), std::string::npos);
}

TEST(Tokens, NpyMalformed) {
  TempDir dir;
  const std::vector<uint32_t> four = {1, 2, 3, 4};
  struct Case {
    std::string bytes, needle;
  };
  std::string bad_magic = npy("<i4", "(4,)", four);
  bad_magic[1] = 'X';
  std::string cut = npy("<i4", "(4,)", four);
  cut.resize(cut.size() - 2);
  std::string long_header = npy("<i4", "(4,)", four);
  long_header[8] = '\xff';
  long_header[9] = '\x7f';
  const Case cases[] = {
      {bad_magic, "magic"},
      {npy(">i4", "(4,)", four), ">i4"},
      {npy("<i8", "(2,)", four), "<i8"},
      {npy("<f4", "(4,)", four), "<f4"},
      {npy("<i4", "(4,)", four, 1, true), "Fortran"},
      {npy("<i4", "(1, 2, 2)", four), "3 dimensions"},
      {npy("<i4", "()", {7}), "0 dimensions"},
      {npy("<i4", "(5,)", four), "holds 16"},
      {cut, "holds 14"},
      {long_header, "header length"},
      {npy("<i4", "(4,", four), "malformed .npy header"},
      {npy("<i4", "(0,)", {}), "no tokens"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string p = dir.write("bad" + std::to_string(i++) + ".npy", c.bytes);
    const std::string msg = error_of([&] { load_tokens(p, 256); });
    EXPECT_NE(msg.find(p), std::string::npos) << "case " << i << ": " << msg;
    EXPECT_NE(msg.find(c.needle), std::string::npos) << "case " << i << ": " << msg;
  }
}

TEST(Tokens, EmptyAndMissingFiles) {
  TempDir dir;
  for (const char* name : {"empty.txt", "empty.npy"}) {
    const std::string p = dir.write(name, "");
    const std::string msg = error_of([&] { load_tokens(p, 256); });
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  }
  const std::string missing = (dir.path / "missing.txt").string();
  EXPECT_NE(error_of([&] { load_tokens(missing, 256); }).find(missing), std::string::npos);
  // One byte: the train split (floor(0.98) = 0 bytes) is empty.
  const std::string one = dir.write("one.txt", "x");
  EXPECT_NE(error_of([&] { load_tokens(one, 256, TextSplit::Train); }).find("empty"), std::string::npos);
  EXPECT_EQ(load_tokens(one, 256, TextSplit::Heldout).size(), 1u);
}

TEST(Tokens, Windows) {
  std::mt19937 rng(8);
  std::vector<int32_t> t(1031);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 256);
  const auto w = make_windows(t, 256);
  ASSERT_EQ(w.size(), 5u);  // 4 full windows + 7 tokens
  EXPECT_EQ(w.back().size(), 7u);
  std::vector<int32_t> joined;
  for (const auto& x : w) joined.insert(joined.end(), x.begin(), x.end());
  EXPECT_EQ(joined, t);
  // A trailing single token predicts nothing: dropped.
  const auto w2 = make_windows(std::vector<int32_t>(t.begin(), t.begin() + 513), 256);
  EXPECT_EQ(w2.size(), 2u);
  EXPECT_THROW(make_windows(t, 1), Error);
}

// safetensors reader/writer: round trip of every dtype with fresh random data, exact decoding of
// 16-bit floats and E4M3 (oracle: ml_dtypes' decode of all 256 codes in codec_vectors.json), a
// strict re-parse of written files with the reference reader's rules (contiguous ranges, 8-byte
// padded header), and every malformed-header case the reader must refuse with the file and tensor
// named in the message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

#include "support/temp_dir.h"

namespace fs = std::filesystem;
using moesq::Error;
using namespace moesq::io;

namespace {

using moesq::test::TempDir;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A hand-made safetensors file: explicit header text, data bytes and (optionally) a lying length.
std::string raw_file(const std::string& header, const std::string& data,
                     std::optional<uint64_t> header_len = std::nullopt) {
  const uint64_t n = header_len.value_or(header.size());
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + data;
}

// Expects constructing a reader on `bytes` to throw an Error whose message contains every `needle`.
void expect_rejected(const TempDir& dir, const std::string& bytes, std::vector<std::string> needles) {
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  needles.push_back(path);
  try {
    SafetensorsFile f(path);
    ADD_FAILURE() << "accepted a malformed file; expected an error containing " << needles[0];
  } catch (const Error& e) {
    for (const auto& n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "message: " << e.what() << "\nmissing: " << n;
    }
  }
}

// The reference reader's strict rules, re-implemented independently of src/io: u64 length, JSON
// object, header padded to 8 bytes with spaces, ranges contiguous from 0 and covering the data.
void strict_reparse(const std::string& path) {
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_LE(n, bytes.size() - 8);
  EXPECT_EQ(n % 8, 0u) << "header not padded to 8 bytes";
  const std::string text = bytes.substr(8, n);
  const size_t last = text.find_last_not_of(' ');
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(text[last], '}');
  const auto j = nlohmann::json::parse(text);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    ranges.emplace_back(it.value()["data_offsets"][0].get<uint64_t>(), it.value()["data_offsets"][1].get<uint64_t>());
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b, at) << "gap or overlap in the data section";
    at = e;
  }
  EXPECT_EQ(8 + n + at, bytes.size()) << "data section not fully covered";
}

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

const std::string kGoodTensor = R"("t": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]})";

}  // namespace

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  std::mt19937 rng(1234);
  const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3,
                       DType::I8,  DType::U8,  DType::I32,  DType::I64};
  // Odd sizes on purpose: small tensors shift the offsets of the ones after them.
  const std::vector<std::vector<int64_t>> shapes = {{3, 5}, {7}, {2, 3, 3}, {}, {1, 9}, {0, 4}, {11}, {5, 1}};
  SafetensorsWriter w;
  std::map<std::string, std::vector<uint8_t>> expect;
  for (size_t i = 0; i < std::size(all); ++i) {
    const std::string name = std::string("w.") + dtype_name(all[i]);
    int64_t numel = 1;
    for (int64_t d : shapes[i]) numel *= d;
    auto bytes = random_bytes(rng, static_cast<size_t>(numel) * dtype_size(all[i]));
    w.add(name, all[i], shapes[i], bytes.data(), bytes.size());
    expect[name] = bytes;
  }
  w.set_metadata("format", "pt");
  w.set_metadata("note", "round trip");
  const std::string path = dir.file("rt.safetensors");
  w.write(path);
  strict_reparse(path);

  SafetensorsFile f(path);
  ASSERT_EQ(f.names().size(), std::size(all));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "round trip");
  for (size_t i = 0; i < std::size(all); ++i) {
    const std::string name = std::string("w.") + dtype_name(all[i]);
    const TensorView& t = f.get(name);
    EXPECT_EQ(t.dtype, all[i]) << name;
    EXPECT_EQ(t.shape, shapes[i]) << name;
    ASSERT_EQ(t.nbytes, expect[name].size()) << name;
    EXPECT_TRUE(t.nbytes == 0 || std::memcmp(t.data, expect[name].data(), t.nbytes) == 0) << name;
    // Natural alignment inside the mapping (writer orders data by element size).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << name;
  }
  EXPECT_EQ(f.get("w.F32").shape_str(), "[3, 5]");
}

TEST(Safetensors, ToF32DecodesExactly) {
  TempDir dir;
  std::mt19937 rng(99);
  constexpr int kN = 4096;
  // bf16: any f32 whose low 16 bits are zero is exactly a bf16 value.
  std::vector<float> bf_expect(kN);
  std::vector<uint16_t> bf_bits(kN);
  // f16: sign · (1 + m/1024) · 2^e for normal e, built with ldexp (independent of the codec).
  std::vector<float> h_expect(kN);
  std::vector<uint16_t> h_bits(kN);
  for (int i = 0; i < kN; ++i) {
    uint32_t u;
    do u = rng() & 0xffff0000u; while ((u & 0x7f800000u) == 0x7f800000u);  // finite only
    std::memcpy(&bf_expect[i], &u, 4);
    bf_bits[i] = static_cast<uint16_t>(u >> 16);
    const uint16_t s = rng() & 1, e = 1 + rng() % 30, m = rng() % 1024;
    h_bits[i] = static_cast<uint16_t>(s << 15 | e << 10 | m);
    h_expect[i] = (s ? -1.0f : 1.0f) * std::ldexp(1.0f + m / 1024.0f, e - 15);
  }
  // f16 subnormals and zero: m · 2^-24.
  h_bits[0] = 0x0001;
  h_expect[0] = std::ldexp(1.0f, -24);
  h_bits[1] = 0x83ff;
  h_expect[1] = -std::ldexp(1023.0f, -24);
  std::vector<int64_t> i64 = {-(int64_t(1) << 40), -1, 0, 7, int64_t(1) << 24};
  std::vector<int32_t> i32 = {-2147483647 - 1, -5, 0, 123456, 2147483647};
  std::vector<int8_t> i8 = {-128, -1, 0, 1, 127};

  SafetensorsWriter w;
  w.add("bf16", DType::BF16, {kN}, bf_bits.data(), kN * 2);
  w.add("f16", DType::F16, {kN}, h_bits.data(), kN * 2);
  w.add("i64", DType::I64, {5}, i64.data(), 40);
  w.add("i32", DType::I32, {5}, i32.data(), 20);
  w.add("i8", DType::I8, {5}, i8.data(), 5);
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  w.add("e4m3", DType::F8_E4M3, {16, 16}, codes.data(), 256);
  const std::string path = dir.file("dec.safetensors");
  w.write(path);
  SafetensorsFile f(path);

  const auto bf = to_f32(f.get("bf16"));
  const auto h = to_f32(f.get("f16"));
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(bf[i], bf_expect[i]) << "bf16 bits " << bf_bits[i];
    ASSERT_EQ(h[i], h_expect[i]) << "f16 bits " << h_bits[i];
  }
  const auto vi64 = to_f32(f.get("i64"));
  const auto vi32 = to_f32(f.get("i32"));
  const auto vi8 = to_f32(f.get("i8"));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(vi64[i], static_cast<float>(i64[i]));
    EXPECT_EQ(vi32[i], static_cast<float>(i32[i]));
    EXPECT_EQ(vi8[i], static_cast<float>(i8[i]));
  }

  // E4M3 against ml_dtypes (independent implementation): all 256 codes, null = NaN.
  std::ifstream vin(std::string(MOESQ_FIXTURES) + "/codec_vectors.json");
  ASSERT_TRUE(vin) << "missing fixture codec_vectors.json";
  const auto vectors = nlohmann::json::parse(vin);
  const auto& oracle = vectors.at("e4m3fn").at("decode_all_codes");
  ASSERT_EQ(oracle.size(), 256u);
  const auto e = to_f32(f.get("e4m3"));
  int nan_count = 0;
  for (int c = 0; c < 256; ++c) {
    if (oracle[c].is_null()) {
      EXPECT_TRUE(std::isnan(e[c])) << "code " << c;
      ++nan_count;
    } else {
      EXPECT_EQ(e[c], oracle[c].get<float>()) << "code " << c;
    }
  }
  EXPECT_EQ(nan_count, 2);
}

TEST(Safetensors, ReadsTheReferenceFixture) {
  // Written by the Python safetensors library: the documented tensors and shapes must load.
  SafetensorsFile f(std::string(MOESQ_FIXTURES) + "/tiny-reference.safetensors");
  EXPECT_EQ(f.get("input_ids").dtype, DType::I32);
  EXPECT_EQ(f.get("input_ids").shape, (std::vector<int64_t>{4, 128}));
  EXPECT_EQ(f.get("logits").shape, (std::vector<int64_t>{4, 128, 256}));
  const auto ids = to_f32(f.get("input_ids"));
  for (float v : ids) ASSERT_TRUE(v >= 0 && v < 256 && v == std::floor(v));
  const auto logits = to_f32(f.get("logits"));
  double sum_abs = 0;
  for (float v : logits) sum_abs += std::fabs(v);
  EXPECT_GT(sum_abs, 0.0);
}

TEST(Safetensors, MissingTensorNamesFileAndTensor) {
  TempDir dir;
  SafetensorsWriter w;
  w.add_f32("a", {2}, {1.f, 2.f});
  const std::string path = dir.file("one.safetensors");
  w.write(path);
  SafetensorsFile f(path);
  try {
    f.get("nope");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
}

TEST(Safetensors, RejectsTruncatedFiles) {
  TempDir dir;
  expect_rejected(dir, "", {"truncated"});
  expect_rejected(dir, std::string("\x10\0\0", 3), {"truncated"});
  // A valid file cut inside its data section: the last tensor's range runs past the data.
  SafetensorsWriter w;
  w.add_f32("tensor_a", {4}, {1.f, 2.f, 3.f, 4.f});
  w.add_f32("tensor_b", {4}, {5.f, 6.f, 7.f, 8.f});
  const std::string good = dir.file("good.safetensors");
  w.write(good);
  std::string bytes = read_bytes(good);
  bytes.resize(bytes.size() - 3);
  expect_rejected(dir, bytes, {"tensor_b", "past the data section"});
  // Cut inside the header.
  bytes = read_bytes(good);
  bytes.resize(20);
  expect_rejected(dir, bytes, {"header length", "past the end"});
}

TEST(Safetensors, RejectsHeaderLengthPastEof) {
  TempDir dir;
  const std::string header = "{" + kGoodTensor + "}";
  expect_rejected(dir, raw_file(header, std::string(24, '\0'), 1 << 20), {"header length 1048576"});
  expect_rejected(dir, raw_file(header, std::string(24, '\0'), ~uint64_t(1)), {"header length"});
  // One byte too long: the length must fit the file exactly with the data.
  expect_rejected(dir, raw_file(header, "", header.size() + 1), {"past the end"});
}

TEST(Safetensors, RejectsMalformedJson) {
  TempDir dir;
  expect_rejected(dir, raw_file("{\"t\": {\"dtype\": ", ""), {"malformed JSON"});
  expect_rejected(dir, raw_file("[1, 2, 3]", ""), {"not an object"});
  expect_rejected(dir, raw_file(R"({"t": 5})", ""), {"tensor t", "not an object"});
  expect_rejected(dir, raw_file(R"({"t": {"shape": [1], "data_offsets": [0, 4]}})", std::string(4, '\0')),
                  {"tensor t", "dtype"});
  expect_rejected(dir, raw_file(R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", std::string(4, '\0')),
                  {"tensor t", "data_offsets"});
  expect_rejected(dir, raw_file(R"({"__metadata__": {"k": 3}})", ""), {"__metadata__", "\"k\""});
}

TEST(Safetensors, RejectsUnknownDtype) {
  TempDir dir;
  for (const char* dt : {"F64", "Q4_K", "bf16", "F8_E5M2"}) {
    const std::string header = std::string(R"({"weird": {"dtype": ")") + dt +
                               R"(", "shape": [2], "data_offsets": [0, 2]}})";
    expect_rejected(dir, raw_file(header, std::string(2, '\0')), {"weird", dt, "unsupported dtype"});
  }
  EXPECT_THROW(parse_dtype("U16"), Error);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::F8_E4M3);
}

TEST(Safetensors, RejectsShapeByteMismatch) {
  TempDir dir;
  // [2, 3] F32 needs 24 bytes; 20 given.
  expect_rejected(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})",
                                std::string(24, '\0')),
                  {"tensor w", "[2, 3]", "20 bytes"});
  // Same byte count, wrong element size.
  expect_rejected(dir, raw_file(R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 24]}})",
                                std::string(24, '\0')),
                  {"tensor w", "BF16"});
  expect_rejected(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 24]}})",
                                std::string(24, '\0')),
                  {"tensor w", "non-negative"});
  expect_rejected(dir, raw_file(R"({"w": {"dtype": "U8", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", ""),
                  {"tensor w", "overflows"});
}

TEST(Safetensors, RejectsOutOfRangeAndOverlappingRanges) {
  TempDir dir;
  expect_rejected(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                                std::string(12, '\0')),
                  {"tensor w", "past the data section"});
  expect_rejected(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})",
                                std::string(12, '\0')),
                  {"tensor w", "begin > end"});
  expect_rejected(dir, raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})",
                                std::string(12, '\0')),
                  {"tensor w", "data_offsets"});
  expect_rejected(dir,
                  raw_file(R"({"first": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                               "second": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                           std::string(16, '\0')),
                  {"first", "second", "overlap"});
  // Identical ranges overlap too; empty tensors overlap nothing.
  expect_rejected(dir,
                  raw_file(R"({"x": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]},
                               "y": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})",
                           std::string(8, '\0')),
                  {"overlap"});
  const std::string path = dir.file("empty_ok.safetensors");
  write_bytes(path, raw_file(R"({"x": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]},
                                 "e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [4, 4]}})",
                             std::string(8, '\0')));
  SafetensorsFile ok(path);
  EXPECT_EQ(ok.get("e").numel(), 0);
}

TEST(Safetensors, WriterRejectsBadInput) {
  SafetensorsWriter w;
  w.add_f32("a", {2}, {1.f, 2.f});
  EXPECT_THROW(w.add_f32("a", {2}, {1.f, 2.f}), Error);           // repeated name
  EXPECT_THROW(w.add_f32("b", {3}, {1.f, 2.f}), Error);           // bytes ≠ shape
  EXPECT_THROW(w.add_f32("__metadata__", {1}, {1.f}), Error);     // reserved
  EXPECT_THROW(w.add("c", DType::I32, {-1}, nullptr, 0), Error);  // negative dim
  EXPECT_EQ(w.size(), 1u);
  EXPECT_EQ(w.data_bytes(), 8u);
}

TEST(Safetensors, WriteIsAtomicAndReplaces) {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  SafetensorsWriter w1;
  w1.add_f32("v", {1}, {1.f});
  w1.write(path);
  SafetensorsWriter w2;
  w2.add_f32("v", {2}, {2.f, 3.f});
  w2.write(path);
  EXPECT_EQ(SafetensorsFile(path).get("v").numel(), 2);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "temporary file left behind";
  // Unwritable destination: error names the path, nothing is created.
  const std::string bad = dir.file("no_such_dir/x.safetensors");
  try {
    w1.write(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

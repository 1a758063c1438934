// The safetensors reader enforces the format (rules listed in
// src/io/safetensors.cpp): unique names, one JSON object, ranges that tile the data section,
// header size limit, dtype × shape = bytes, __metadata__ string → string. Files are made here by hand.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "support/temp_dir.h"

namespace {

using moesq::Error;
using moesq::io::SafetensorsFile;
using moesq::test::TempDir;

std::string raw_file(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

// The Error message of opening `bytes`, or "" when it opened.
std::string open_error(const TempDir& dir, const std::string& bytes) {
  const std::string path = dir.write("t.safetensors", bytes);
  try {
    SafetensorsFile f(path);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "the error must name the file: " << msg;
    return msg;
  }
  return "";
}

#define EXPECT_REJECTED_WITH(bytes, needle)                                           \
  do {                                                                                \
    const std::string _m = open_error(dir, bytes);                                    \
    EXPECT_NE(_m.find(needle), std::string::npos) << "message: \"" << _m << "\""; \
  } while (0)

const std::string kA = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
const std::string kB = R"("b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]})";

TEST(SafetensorsStrict, AWellFormedFileOpens) {
  TempDir dir;
  EXPECT_EQ(open_error(dir, raw_file("{" + kA + ", " + kB + "}  ", std::string(12, '\1'))), "");
}

TEST(SafetensorsStrict, DuplicateTensorNameIsRejected) {
  TempDir dir;
  const std::string a2 = R"("a": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]})";
  EXPECT_REJECTED_WITH(raw_file("{" + kA + ", " + a2 + "}", std::string(12, '\0')), "key \"a\" twice");
  // A key repeated inside one entry (the last "dtype" would win) is rejected too.
  EXPECT_REJECTED_WITH(
      raw_file(R"({"a": {"dtype": "BF16", "dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", std::string(8, '\0')),
      "key \"dtype\" twice");
  // So is a repeated __metadata__ key.
  EXPECT_REJECTED_WITH(raw_file(R"({"__metadata__": {"k": "1", "k": "2"}, )" + kA + "}", std::string(8, '\0')),
                       "key \"k\" twice");
}

TEST(SafetensorsStrict, HeaderIsExactlyOneObject) {
  TempDir dir;
  EXPECT_REJECTED_WITH(raw_file(" {" + kA + "}", std::string(8, '\0')), "must start with '{'");
  EXPECT_REJECTED_WITH(raw_file("{" + kA + "} {}", std::string(8, '\0')), "malformed JSON");
  EXPECT_REJECTED_WITH(raw_file("{" + kA + "}x", std::string(8, '\0')), "malformed JSON");
  EXPECT_REJECTED_WITH(raw_file("", ""), "not an object");
}

TEST(SafetensorsStrict, RangesMustTileTheDataSection) {
  TempDir dir;
  // A hole between a and b.
  const std::string b_late = R"("b": {"dtype": "U8", "shape": [4], "data_offsets": [9, 13]})";
  EXPECT_REJECTED_WITH(raw_file("{" + kA + ", " + b_late + "}", std::string(13, '\0')), "hole of 1 bytes");
  // Data not starting at 0.
  const std::string b_only = R"("b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]})";
  EXPECT_REJECTED_WITH(raw_file("{" + b_only + "}", std::string(8, '\0')), "begins at 4");
  // Trailing bytes after the last tensor.
  EXPECT_REJECTED_WITH(raw_file("{" + kA + "}", std::string(9, '\0')), "1 bytes after the last tensor");
  // Data section with no tensors but bytes in it.
  EXPECT_REJECTED_WITH(raw_file("{}", std::string(4, '\0')), "4 bytes after the last tensor");
  // Overlap still reported as an overlap.
  const std::string b_over = R"("b": {"dtype": "U8", "shape": [4], "data_offsets": [6, 10]})";
  EXPECT_REJECTED_WITH(raw_file("{" + kA + ", " + b_over + "}", std::string(10, '\0')), "overlap");
  // Out of bounds.
  EXPECT_REJECTED_WITH(raw_file("{" + kA + "}", std::string(4, '\0')), "past the data section");
  // An empty tensor occupies nothing, wherever it sits inside the section.
  const std::string e = R"("e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [4, 4]})";
  EXPECT_EQ(open_error(dir, raw_file("{" + kA + ", " + e + "}", std::string(8, '\0'))), "");
  EXPECT_EQ(open_error(dir, raw_file(R"({"e": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}})", "")), "");
  EXPECT_EQ(open_error(dir, raw_file("{}", "")), "");
}

TEST(SafetensorsStrict, HeaderSizeLimit) {
  TempDir dir;
  // A length above 100 MB is refused before anything is parsed (the file is that long, sparse).
  const std::string path = dir.file("big.safetensors");
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    const uint64_t n = 100'000'001;
    std::fwrite(&n, 8, 1, f);
    std::fseek(f, static_cast<long>(8 + n), SEEK_SET);
    std::fputc(0, f);
    std::fclose(f);
  }
  try {
    SafetensorsFile f(path);
    ADD_FAILURE() << "accepted a 100 MB+ header";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("100000000-byte limit"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsStrict, DtypeTimesShapeIsTheByteLength) {
  TempDir dir;
  EXPECT_REJECTED_WITH(raw_file(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", std::string(8, '\0')),
                       "does not match data_offsets");
  EXPECT_REJECTED_WITH(raw_file(R"({"a": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", std::string(8, '\0')),
                       "not a non-negative integer");
}

TEST(SafetensorsStrict, MetadataIsStringToString) {
  TempDir dir;
  EXPECT_REJECTED_WITH(raw_file(R"({"__metadata__": {"k": 1}, )" + kA + "}", std::string(8, '\0')), "not a string");
  EXPECT_REJECTED_WITH(raw_file(R"({"__metadata__": ["k"], )" + kA + "}", std::string(8, '\0')), "not an object");
  EXPECT_REJECTED_WITH(raw_file(R"({"__metadata__": {"k": {"x": "y"}}, )" + kA + "}", std::string(8, '\0')),
                       "not a string");
  EXPECT_EQ(open_error(dir, raw_file(R"({"__metadata__": {"format": "pt"}, )" + kA + "}", std::string(8, '\0'))), "");
}

}  // namespace

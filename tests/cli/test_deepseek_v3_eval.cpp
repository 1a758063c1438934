// `moesq eval` on the DeepSeek-V3 fixture: the reference's two 64-token sequences written as one
// .npy of 128 token ids, evaluated in windows of 64, must give transformers' cross-entropy
// (summary.json "ce", the mean over both sequences' 2 × 63 predicted tokens) within 1e-4 nats/token.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "support/temp_dir.h"

namespace {

const std::string kModelDir = std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3";
const std::string kRefDir = std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3-reference";
constexpr double kCeAtol = 1e-4;  // issue 16: eval nats/token vs summary.json

// A 1-D little-endian int32 .npy (format 1.0: magic, header length, dict padded to 64 bytes).
std::string npy_i32(const std::vector<int32_t>& v) {
  std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (" + std::to_string(v.size()) + ",), }";
  const size_t unpadded = 10 + dict.size() + 1;
  dict += std::string((64 - unpadded % 64) % 64, ' ') + "\n";
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict;
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(CliDeepseekV3, EvalMatchesTransformersCrossEntropy) {
  moesq::io::SafetensorsFile ref(kRefDir + "/reference.safetensors");
  const auto& ids_t = ref.get("input_ids");
  ASSERT_EQ(ids_t.shape.size(), 2u);
  const int64_t T = ids_t.shape[1];
  std::vector<int32_t> ids;
  for (float v : moesq::io::to_f32(ids_t)) ids.push_back(static_cast<int32_t>(v));
  std::ifstream js(kRefDir + "/summary.json");
  const double ce = nlohmann::json::parse(js).at("ce").get<double>();

  moesq::test::TempDir dir("moesq_dsv3_eval");
  const std::string data = dir.write("ids.npy", npy_i32(ids));
  const std::string cmd = "MOESQ_QUIET=1 '" + std::string(MOESQ_BINARY) + "' eval '" + kModelDir + "' --data '" +
                          data + "' --seq-len " + std::to_string(T) + " --json --threads 2 >'" + dir.file("out") +
                          "' 2>'" + dir.file("err") + "'";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << slurp(dir.file("err"));
  const auto j = nlohmann::json::parse(slurp(dir.file("out")));
  EXPECT_EQ(j.at("predicted_tokens").get<int64_t>(), static_cast<int64_t>(ids.size()) - ids_t.shape[0]);
  EXPECT_EQ(j.at("act_quant").get<std::string>(), "none");
  const double got = j.at("nats_per_token").get<double>();
  std::printf("moesq eval %.7f vs summary.json %.7f (|diff| %.2g)\n", got, ce, std::fabs(got - ce));
  EXPECT_NEAR(got, ce, kCeAtol);
}

}  // namespace

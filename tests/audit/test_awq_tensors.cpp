// AWQ int4 checkpoint tensors through safetensors: names, shapes, dtypes and a bitwise round trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "audit/awq_tensors.h"
#include "core/error.h"
#include "io/safetensors.h"

using namespace moesq;
using namespace moesq::audit;
using namespace moesq::format;

TEST(Awq, CheckpointTensorsRoundTrip) {
  const auto l = awq_random(64, 256, 17, 0.01f, 0.02f);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("moesq_awq_" + std::to_string(::getpid()) + ".safetensors")).string();
  io::SafetensorsWriter w;
  awq_add_tensors(w, "model.layers.0.mlp.experts.3.gate_proj", l);
  w.write(path);
  {
    io::SafetensorsFile f(path);
    EXPECT_EQ(f.get("model.layers.0.mlp.experts.3.gate_proj.qweight").shape, (std::vector<int64_t>{256, 8}));
    EXPECT_EQ(f.get("model.layers.0.mlp.experts.3.gate_proj.scales").dtype, io::DType::F16);
    const auto back = awq_read_tensors(f, "model.layers.0.mlp.experts.3.gate_proj");
    EXPECT_EQ(back.N, 64);
    EXPECT_EQ(back.K, 256);
    EXPECT_EQ(back.qweight, l.qweight);
    EXPECT_EQ(back.qzeros, l.qzeros);
    EXPECT_EQ(back.scales, l.scales);
    EXPECT_THROW(awq_read_tensors(f, "missing"), moesq::Error);
  }
  std::filesystem::remove(path);
}

// The GPU engine's host loader (runtime/weights.h) reads every checkpoint layout the CPU loader reads,
// through io: a paired 4:8 checkpoint as moesq writes it, exported to compressed-tensors NVFP4 and to
// pair-bitmask, uploads the SAME kernel bytes (so `eval --device cuda` of an export computes what the
// moesq original computes); a compressed-tensors INT4 (pack-quantized) checkpoint runs the bf16 backend
// on its exact bf16 products; a dense NVFP4 export is refused by the paired backends naming the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "format/kernel_layout.h"
#include "io/checkpoint.h"
#include "io/export_checkpoint.h"
#include "io/export_layouts.h"
#include "io/tensor_names.h"
#include "runtime/experts/bf16.h"
#include "runtime/experts/paired_sparse.h"
#include "runtime/weights.h"
#include "support/int4_checkpoint.h"
#include "support/packed_checkpoint.h"
#include "support/temp_dir.h"

using namespace moesq;

namespace {

void expect_same_kernel_weights(const format::KernelWeights& a, const format::KernelWeights& b, const std::string& what) {
  EXPECT_EQ(a.num_experts, b.num_experts) << what;
  EXPECT_EQ(a.M, b.M) << what;
  EXPECT_EQ(a.K, b.K) << what;
  EXPECT_EQ(a.M_pad, b.M_pad) << what;
  EXPECT_EQ(a.K_pad, b.K_pad) << what;
  EXPECT_TRUE(a.data == b.data) << what << ": packed kernel bytes differ";
  EXPECT_TRUE(a.gamma == b.gamma) << what << ": global scales differ";
}

const runtime::PairedSparseHostExperts& sparse(const runtime::HostMoe& m) {
  return dynamic_cast<const runtime::PairedSparseHostExperts&>(*m.experts);
}
const runtime::Bf16HostExperts& dense(const runtime::HostMoe& m) {
  return dynamic_cast<const runtime::Bf16HostExperts&>(*m.experts);
}

class RuntimeWeightsLayouts : public ::testing::Test {
 protected:
  test::TempDir tmp_{"moesq_test_rt_layouts"};
  io::Checkpoint src_{MOESQ_DEFAULT_MODEL};
};

// The moesq checkpoint is written in the canonical form an export → import round trip returns
// (io::canonical_sparse48: a kept pair quantized to all-zero codes is re-assigned to the lowest zero
// pairs; same dequantized values, tests/io/test_export_checkpoint.cpp), so the bytes can be compared.
TEST_F(RuntimeWeightsLayouts, PairedExportsUploadTheMoesqCheckpointsBytes) {
  std::map<std::string, format::PackedWeight> packed = test::pack_all_experts(src_, true);
  int64_t changed = 0;
  for (auto& [name, w] : packed) w = io::canonical_sparse48(*w.sparse48(), &changed);
  const std::string moesq_dir = test::write_moesq_checkpoint(src_, packed, true, tmp_.path / "moesq");
  io::export_checkpoint(moesq_dir, io::ExportFormat::CompressedTensors, (tmp_.path / "ct").string());
  io::export_checkpoint(moesq_dir, io::ExportFormat::PairBitmask, (tmp_.path / "pb").string());
  const io::Checkpoint ref_ck(moesq_dir);
  for (int64_t l : {0, 3}) {
    const runtime::HostMoeLayer ref = runtime::load_host_moe_layer(ref_ck, l, runtime::ExpertBackend::kAuto);
    EXPECT_EQ(ref.expert_storage, io::ExpertStorage::Sparse48);
    EXPECT_EQ(ref.backend, runtime::ExpertBackend::kSparseW4A4);
    EXPECT_FALSE(sparse(ref.weights).gu.data.empty());
    for (const char* layout : {"ct", "pb"}) {
      const io::Checkpoint ck((tmp_.path / layout).string());
      const runtime::HostMoeLayer got = runtime::load_host_moe_layer(ck, l, runtime::ExpertBackend::kAuto);
      const std::string what = std::string(layout) + " layer " + std::to_string(l);
      EXPECT_EQ(got.expert_storage, io::ExpertStorage::Sparse48) << what;
      EXPECT_EQ(got.backend, ref.backend) << what;
      EXPECT_EQ(got.act_quant, ref.act_quant) << what;
      EXPECT_EQ(got.weights.router, ref.weights.router) << what;
      expect_same_kernel_weights(sparse(got.weights).gu, sparse(ref.weights).gu, what + " gate|up");
      expect_same_kernel_weights(sparse(got.weights).down, sparse(ref.weights).down, what + " down");
    }
  }
  // The whole model too (attention weights are copied unchanged by the export).
  const runtime::HostModel a = runtime::load_host_model(ref_ck, runtime::ExpertBackend::kSparseW4A4);
  const runtime::HostModel b = runtime::load_host_model(io::Checkpoint((tmp_.path / "ct").string()),
                                                        runtime::ExpertBackend::kSparseW4A4);
  EXPECT_EQ(a.act_block, b.act_block);
  EXPECT_EQ(a.lm_head, b.lm_head);
  EXPECT_EQ(a.layers[2].attn.qkv, b.layers[2].attn.qkv);
  expect_same_kernel_weights(sparse(a.layers[2].moe).down, sparse(b.layers[2].moe).down, "whole model, layer 2 down");
  // An expert-parallel rank's shard (docs/PARALLEL.md): experts [2, 5) of every MoE layer are the same
  // bytes and global scales as those experts of the whole load; router and attention whole.
  const runtime::HostModel c = runtime::load_host_model(ref_ck, runtime::ExpertBackend::kSparseW4A4, 2, 5);
  for (int64_t l = 0; l < ref_ck.spec().num_layers; ++l) {
    if (!ref_ck.spec().is_moe_layer(l)) continue;
    const runtime::PairedSparseHostExperts &whole = sparse(a.layers[l].moe), &shard = sparse(c.layers[l].moe);
    EXPECT_EQ(shard.begin, 2);
    EXPECT_EQ(shard.end, 5);
    for (const auto& [w, h, name] : {std::tuple{&whole.gu, &shard.gu, "gate|up"}, {&whole.down, &shard.down, "down"}}) {
      ASSERT_EQ(h->num_experts, 3) << name;
      const size_t per = w->expert_bytes();
      EXPECT_TRUE(std::equal(h->data.begin(), h->data.end(), w->data.begin() + 2 * per)) << "layer " << l << " " << name;
      EXPECT_EQ(h->data.size(), 3 * per);
      EXPECT_TRUE(std::equal(h->gamma.begin(), h->gamma.end(), w->gamma.begin() + 2)) << "layer " << l << " " << name;
    }
    EXPECT_EQ(c.layers[l].moe.router, a.layers[l].moe.router);
    EXPECT_EQ(c.layers[l].attn.qkv, a.layers[l].attn.qkv);
  }
  EXPECT_THROW(runtime::load_host_model(ref_ck, runtime::ExpertBackend::kSparseW4A4, 3, 3), Error);  // empty
  EXPECT_THROW(runtime::load_host_model(ref_ck, runtime::ExpertBackend::kSparseW4A4, 0, 10000), Error);
}

// The bf16 backend's shard: expert rows [begin, end) of the whole load, bit for bit.
TEST_F(RuntimeWeightsLayouts, Bf16ShardHoldsItsExpertsRows) {
  const int64_t E = src_.spec().num_experts, b = 1, e = E - 1;
  const runtime::HostModel whole = runtime::load_host_model(src_, runtime::ExpertBackend::kBf16);
  const runtime::HostModel shard = runtime::load_host_model(src_, runtime::ExpertBackend::kBf16, b, e);
  for (int64_t l = 0; l < src_.spec().num_layers; ++l) {
    const runtime::Bf16HostExperts &w = dense(whole.layers[l].moe), &h = dense(shard.layers[l].moe);
    EXPECT_EQ(h.begin, b);
    EXPECT_EQ(h.end, e);
    const size_t gu = w.gu.size() / E, dn = w.down.size() / E;
    ASSERT_EQ(h.gu.size(), (e - b) * gu);
    EXPECT_TRUE(std::equal(h.gu.begin(), h.gu.end(), w.gu.begin() + b * gu)) << "layer " << l;
    EXPECT_TRUE(std::equal(h.down.begin(), h.down.end(), w.down.begin() + b * dn)) << "layer " << l;
  }
  try {
    runtime::load_host_model(src_, runtime::ExpertBackend::kBf16, 0, E + 1);
    FAIL() << "a shard past the experts was read";
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("outside the"), std::string::npos) << x.what();
  }
}

TEST_F(RuntimeWeightsLayouts, Int4PackQuantizedRunsTheBf16BackendOnItsProducts) {
  const std::string dir = (tmp_.path / "int4").string();
  const auto want = test::write_int4_checkpoint(src_, dir, 32);
  const io::Checkpoint ck(dir);
  const runtime::HostMoeLayer got = runtime::load_host_moe_layer(ck, 1, runtime::ExpertBackend::kAuto);
  EXPECT_EQ(got.expert_storage, io::ExpertStorage::Int4);
  EXPECT_EQ(got.backend, runtime::ExpertBackend::kBf16);
  const io::ModelSpec& s = src_.spec();
  const int64_t H = s.hidden_size, I = s.moe_intermediate_size, H_pad = format::padded_k(H);
  const std::vector<float>& up = want.at(io::expert_tensor_prefix(s, 1, 5, io::ExpertProj::Up));
  for (int64_t n : {0L, I - 1})
    for (int64_t k : {0L, 7L, H - 1})
      EXPECT_EQ(dense(got.weights).gu[(5 * 2 * I + I + n) * H_pad + format::act_storage_index(k, format::ActLayout::kKMajor)],
                f32_to_bf16(up[n * H + k]))
          << "up row " << n << " col " << k;
  EXPECT_THROW(runtime::load_host_moe_layer(ck, 1, runtime::ExpertBackend::kSparseW4A4), Error);
}

TEST_F(RuntimeWeightsLayouts, DenseNvfp4ExportIsRefusedByThePairedBackendsNamingTheTensor) {
  const std::string moesq_dir = test::write_moesq_checkpoint(src_, test::pack_all_experts(src_, false), false,
                                                             tmp_.path / "dense");
  io::export_checkpoint(moesq_dir, io::ExportFormat::CompressedTensors, (tmp_.path / "ct").string());
  for (const std::string dir : {moesq_dir, (tmp_.path / "ct").string()}) {
    const io::Checkpoint ck(dir);
    try {
      runtime::load_host_moe_layer(ck, 0, runtime::ExpertBackend::kSparseW4A4);
      ADD_FAILURE() << dir << ": dense NVFP4 accepted by sparse-w4a4";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("nvfp4"), std::string::npos) << e.what();
    }
    // auto picks nvfp4-w4a16, which is not built: the error names the built backends.
    try {
      runtime::load_host_moe_layer(ck, 0, runtime::ExpertBackend::kAuto);
      ADD_FAILURE() << dir << ": auto on dense NVFP4 did not name the built backends";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("built: bf16, sparse-w4a4, sparse-w4a16"), std::string::npos) << e.what();
    }
    // bf16 runs it on the exact dequantized values.
    const runtime::HostMoeLayer b = runtime::load_host_moe_layer(ck, 0, runtime::ExpertBackend::kBf16);
    EXPECT_EQ(b.expert_storage, io::ExpertStorage::Nvfp4);
    EXPECT_FALSE(dense(b.weights).gu.empty());
  }
}

// A compressed-tensors checkpoint whose config ignores layer 0's routed experts, stored bf16 beside the
// packed rest, loads on the CPU (tests/cli/test_config_groups.cpp) and is refused by the GPU loader.
TEST_F(RuntimeWeightsLayouts, IgnoredDenseExpertsBesidePackedOnesAreRefusedNamingTheConfig) {
  const std::string moesq_dir = test::write_moesq_checkpoint(src_, test::pack_all_experts(src_, true), true,
                                                             tmp_.path / "moesq");
  const std::string ct = (tmp_.path / "ct").string();
  io::export_checkpoint(moesq_dir, io::ExportFormat::CompressedTensors, ct);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(ct + "/config.json"));
  cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"] = nullptr;
  cfg["quantization_config"]["ignore"] = {"lm_head", "re:model\\.layers\\.0\\.mlp\\.experts\\."};
  std::ofstream(ct + "/config.json") << cfg.dump(2);
  const io::Checkpoint exported(ct);
  io::SafetensorsWriter w;
  const std::string layer0 = "model.layers.0.mlp.experts.";
  for (const std::string& n : exported.names())
    if (n.rfind(layer0, 0) != 0) w.add(n, exported.get(n).dtype, exported.get(n).shape, exported.get(n).data, exported.get(n).nbytes);
  for (const std::string& n : src_.names())
    if (n.rfind(layer0, 0) == 0) w.add(n, src_.get(n).dtype, src_.get(n).shape, src_.get(n).data, src_.get(n).nbytes);
  const std::string mixed = (tmp_.path / "mixed").string();
  std::filesystem::create_directories(mixed);
  std::filesystem::copy_file(ct + "/config.json", mixed + "/config.json");
  w.write(mixed + "/model.safetensors");
  const io::Checkpoint ck(mixed);
  try {
    runtime::load_host_moe_layer(ck, 1, runtime::ExpertBackend::kAuto);
    ADD_FAILURE() << "dense ignored experts beside packed ones were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quantization_config.ignore"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(mixed), std::string::npos) << e.what();
  }
}

}  // namespace

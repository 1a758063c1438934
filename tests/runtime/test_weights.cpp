// CPU tests of the GPU engine's host side and of the ops' CPU twins against the CPU forward's own
// arithmetic (model/tensor_math.h, DecoderModel::route): the twins define what the kernels must compute, so they
// must agree with the model the engine is compared to.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "io/checkpoint.h"
#include "io/config_hybrid.h"
#include "io/import_checkpoint.h"
#include "io/tensor_names.h"
#include "model/decoder.h"
#include "model/rope.h"
#include "model/tensor_math.h"
#include "format/kernel_layout.h"
#include "ops/qk_rope/qk_rope.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/dense_swiglu/dense_swiglu.h"
#include "ops/router_topk/router_topk.h"
#include "runtime/experts/bf16.h"
#include "io/compressed_checkpoint.h"
#include "runtime/layers/moe_block.h"
#include "runtime/layers/moe_workspace.h"
#include "runtime/weights.h"

using namespace moesq;

namespace {
// bf16 output rounding of an fp32 value: half an ulp at 8 significant bits, plus one ulp slack for
// the fp64-tree vs sequential sum of squares.
constexpr double kBf16Rel = 1.0 / 128;
}  // namespace

TEST(RuntimeWeights, TinyBf16LayoutAndShapes) {
  const io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  const runtime::HostModel m = runtime::load_host_model(ckpt, runtime::ExpertBackend::kAuto);
  const auto& s = m.spec;
  EXPECT_EQ(m.backend, runtime::ExpertBackend::kBf16);
  EXPECT_FALSE(m.act_quant);
  ASSERT_EQ(m.layers.size(), static_cast<size_t>(s.num_layers));
  const int64_t H = s.hidden_size, I = s.moe_intermediate_size, E = s.num_experts;
  const int64_t H_pad = format::padded_k(H), I_pad = format::padded_k(I);
  const auto& L = m.layers[1];
  EXPECT_EQ(L.attn.qkv.size(), static_cast<size_t>((s.num_heads + 2 * s.num_kv_heads) * s.head_dim * H));
  const auto& X = dynamic_cast<const runtime::Bf16HostExperts&>(*L.moe.experts);
  EXPECT_EQ(X.gu.size(), static_cast<size_t>(E * 2 * I * H_pad));
  EXPECT_EQ(X.down.size(), static_cast<size_t>(E * H * I_pad));
  // Expert 3's up row 5 column 7 sits at its kKMajor storage index in fused row I + 5.
  const model::DecoderModel cpu(ckpt);
  const float up = cpu.layer(1).experts[3].up[5 * H + 7];
  EXPECT_EQ(X.gu[(3 * 2 * I + I + 5) * H_pad + format::act_storage_index(7, format::ActLayout::kKMajor)], f32_to_bf16(up));
  // k_proj rows follow the q rows in the fused projection.
  const float kp = cpu.layer(1).k_proj[2 * H + 9];
  EXPECT_EQ(L.attn.qkv[(s.num_heads * s.head_dim + 2) * H + 9], f32_to_bf16(kp));
}

TEST(RuntimeWeights, OneMoeLayerEqualsTheWholeModelsLayer) {
  const io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  const runtime::HostModel m = runtime::load_host_model(ckpt, runtime::ExpertBackend::kAuto);
  for (int64_t l : {0, 3}) {
    const runtime::HostMoeLayer one = runtime::load_host_moe_layer(ckpt, l, runtime::ExpertBackend::kAuto);
    EXPECT_EQ(one.layer, l);
    EXPECT_EQ(one.backend, m.backend);
    EXPECT_EQ(one.expert_storage, m.expert_storage);
    EXPECT_EQ(one.act_quant, m.act_quant);
    EXPECT_EQ(one.weights.router, m.layers[l].moe.router) << "layer " << l;
    const auto& a = dynamic_cast<const runtime::Bf16HostExperts&>(*one.weights.experts);
    const auto& b = dynamic_cast<const runtime::Bf16HostExperts&>(*m.layers[l].moe.experts);
    EXPECT_EQ(a.gu, b.gu) << "layer " << l;
    EXPECT_EQ(a.down, b.down) << "layer " << l;
    EXPECT_FALSE(one.weights.router.empty());
  }
  for (int64_t bad : {-1, 4}) {
    try {
      runtime::load_host_moe_layer(ckpt, bad, runtime::ExpertBackend::kAuto);
      ADD_FAILURE() << "no error for layer " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("layer " + std::to_string(bad) + " outside [0, 4)"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(runtime::load_host_moe_layer(ckpt, 0, runtime::ExpertBackend::kSparseW4A4), Error);
}

TEST(RuntimeWeights, BackendsResolveOrNameWhatIsBuilt) {
  using runtime::ExpertBackend;
  using io::ExpertStorage;
  EXPECT_EQ(runtime::resolve_backend(ExpertBackend::kAuto, ExpertStorage::Sparse48), ExpertBackend::kSparseW4A4);
  EXPECT_EQ(runtime::resolve_backend(ExpertBackend::kBf16, ExpertStorage::Sparse48), ExpertBackend::kBf16);
  EXPECT_EQ(runtime::resolve_backend(ExpertBackend::kAuto, ExpertStorage::Int4), ExpertBackend::kBf16);
  EXPECT_EQ(runtime::resolve_backend(ExpertBackend::kSparseW4A16, ExpertStorage::Sparse48), ExpertBackend::kSparseW4A16);
  for (auto [b, st] : {std::pair{ExpertBackend::kAwqW4A16, ExpertStorage::Dense},
                       std::pair{ExpertBackend::kAuto, ExpertStorage::Nvfp4}}) {
    try {
      runtime::resolve_backend(b, st);
      ADD_FAILURE() << "no error for " << runtime::expert_backend_name(b) << " on " << io::expert_storage_name(st);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("built: bf16, sparse-w4a4, sparse-w4a16"), std::string::npos) << e.what();
    }
  }
  try {
    runtime::resolve_backend(ExpertBackend::kSparseW4A16, ExpertStorage::Dense);
    ADD_FAILURE() << "no error for sparse-w4a16 on bf16 experts";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sparse-w4a16 needs a paired-4:8-nvfp4 checkpoint"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("has bf16 experts"), std::string::npos) << e.what();
  }
  EXPECT_THROW(runtime::parse_expert_backend("marlin"), Error);
  EXPECT_EQ(runtime::parse_expert_backend("sparse-w4a16"), ExpertBackend::kSparseW4A16);
}

TEST(RuntimeWeights, SyntheticSpecs) {
  const io::ModelSpec s = runtime::synthetic_spec("qwen3-30b-a3b", 0);
  EXPECT_EQ(s.num_layers, 48);
  EXPECT_EQ(s.hidden_size, 2048);
  EXPECT_EQ(s.num_heads, 32);
  EXPECT_EQ(s.num_kv_heads, 4);
  EXPECT_EQ(s.num_experts, 128);
  EXPECT_EQ(s.top_k, 8);
  EXPECT_EQ(s.moe_intermediate_size, 768);
  EXPECT_EQ(s.vocab_size, 151936);
  EXPECT_EQ(runtime::synthetic_spec("qwen3-30b-a3b", 4).num_layers, 4);
  EXPECT_THROW(runtime::synthetic_spec("llama", 0), Error);
  // Qwen3-Next-80B-A3B (its config.json through the family parser): 48 layers, every fourth gated
  // attention of 16 × 256 with RoPE over 64 dims, the rest Gated DeltaNet (16 / 32 heads of 128).
  const runtime::HostModel next = runtime::synthetic_model("qwen3-next-80b-a3b", 8);
  EXPECT_EQ(runtime::synthetic_spec("qwen3-next-80b-a3b", 0).num_layers, 48);
  EXPECT_TRUE(runtime::synthetic_is_hybrid("qwen3-next-80b-a3b"));
  EXPECT_FALSE(runtime::synthetic_is_hybrid("qwen3-30b-a3b"));
  EXPECT_EQ(next.spec.num_layers, 8);
  EXPECT_EQ(next.spec.num_experts, 512);
  EXPECT_EQ(next.spec.top_k, 10);
  EXPECT_EQ(next.spec.head_dim, 256);
  EXPECT_TRUE(next.spec.shared_expert_gate);
  EXPECT_TRUE(runtime::supports(next.spec)) << runtime::gpu_refusal(next.spec);
  EXPECT_EQ(next.gdn.nv, 32);
  EXPECT_EQ(next.gdn.dk, 128);
  EXPECT_EQ(next.gdn.proj_cols(), 2 * 16 * 128 + 2 * 32 * 128 + 2 * 32);
  EXPECT_EQ(next.rope.inv_freq.size(), 32u);  // a quarter of 256 dims rotate
  ASSERT_EQ(next.layers.size(), 8u);
  for (int64_t l = 0; l < 8; ++l) {
    EXPECT_EQ(next.layers[l].is_gdn, (l + 1) % 4 != 0) << "layer " << l;
    EXPECT_EQ(next.layers[l].attn.output_gate, (l + 1) % 4 == 0) << "layer " << l;
  }
  // Qwen3.5-397B-A17B (its text_config, model_type qwen3_5_moe_text): 60 layers, hidden 4,096, every
  // fourth gated attention of 32 × 256, Gated DeltaNet with 16 key / 64 value heads of 128, 512 experts
  // of 1,024 top-10, a gated shared expert of 1,024, vocabulary 248,320.
  const runtime::HostModel q35 = runtime::synthetic_model("qwen3.5-397b-a17b", 4);
  EXPECT_TRUE(runtime::synthetic_is_hybrid("qwen3.5-397b-a17b"));
  EXPECT_EQ(runtime::synthetic_spec("qwen3.5-397b-a17b", 0).num_layers, 60);
  EXPECT_EQ(q35.spec.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(q35.spec.hidden_size, 4096);
  EXPECT_EQ(q35.spec.vocab_size, 248320);
  EXPECT_EQ(q35.spec.num_heads, 32);
  EXPECT_EQ(q35.spec.num_kv_heads, 2);
  EXPECT_EQ(q35.spec.head_dim, 256);
  EXPECT_EQ(q35.spec.num_experts, 512);
  EXPECT_EQ(q35.spec.top_k, 10);
  EXPECT_EQ(q35.spec.moe_intermediate_size, 1024);
  EXPECT_EQ(q35.spec.shared_expert_intermediate_size, 1024);
  EXPECT_TRUE(q35.spec.shared_expert_gate);
  EXPECT_TRUE(runtime::supports(q35.spec)) << runtime::gpu_refusal(q35.spec);
  EXPECT_EQ(q35.gdn.nk, 16);
  EXPECT_EQ(q35.gdn.nv, 64);
  EXPECT_EQ(q35.gdn.proj_cols(), 2 * 16 * 128 + 2 * 64 * 128 + 2 * 64);
  EXPECT_EQ(q35.rope.inv_freq.size(), 32u);
  for (int64_t l = 0; l < 4; ++l) {
    EXPECT_EQ(q35.layers[l].is_gdn, l != 3) << "layer " << l;
    EXPECT_EQ(q35.layers[l].attn.rotary_dim, l == 3 ? 64 : 0) << "layer " << l;
  }
  EXPECT_EQ(runtime::synthetic_model("qwen3-30b-a3b", 2).layers.size(), 2u);
  EXPECT_THROW(runtime::synthetic_model("qwen3-next-80b-a3b", 49), Error);
  EXPECT_THROW(runtime::synthetic_model("qwen3.5-397b-a17b", 61), Error);
  EXPECT_THROW(runtime::synthetic_spec("qwen3-30b-a3b", 49), Error);
}

// The engine's default MoE slice (EngineOptions::moe_tokens 0: the most tokens whose workspace fits in
// 16 GiB, engine.cu): the whole of serve's default 8,192-token budget for Qwen3-30B-A3B (no slicing),
// and about a thousand tokens for Kimi-K2.5's 384 experts, whose workspace at 8,192 tokens would not fit.
TEST(RuntimeWeights, MoeWorkspaceBytesAtRealShapes) {
  constexpr size_t kBudget = size_t(16) << 30;
  const runtime::MoeBlockDims q = runtime::moe_block_dims(runtime::synthetic_spec("qwen3-30b-a3b", 0));
  const runtime::MoeBlockDims k = runtime::moe_block_dims(runtime::synthetic_spec("kimi-k2.5", 0));
  std::printf("MoE workspace at 8192 tokens: qwen3-30b-a3b %.2f GiB, kimi-k2.5 %.2f GiB\n",
              runtime::moe_workspace_bytes(q, 8192) / double(1 << 30), runtime::moe_workspace_bytes(k, 8192) / double(1 << 30));
  EXPECT_LE(runtime::moe_workspace_bytes(q, 8192), kBudget);
  EXPECT_GT(runtime::moe_workspace_bytes(k, 8192), kBudget);
  EXPECT_LE(runtime::moe_workspace_bytes(k, 512), kBudget);
  EXPECT_LT(runtime::moe_workspace_bytes(k, 511), runtime::moe_workspace_bytes(k, 512));  // grows with T
}

// kimi-k2.5's synthetic spec is what the config parser makes of Kimi-K2.5's text config (the public
// config.json's keys that set shapes and arithmetic), and the GPU engine runs every block of it.
TEST(RuntimeWeights, SyntheticKimiSpecIsItsConfigParsed) {
  const io::ModelSpec k = runtime::synthetic_spec("kimi-k2.5", 3);
  EXPECT_EQ(k.num_layers, 3);
  EXPECT_TRUE(runtime::supports(k)) << runtime::gpu_refusal(k);
  const nlohmann::json cfg = {
      {"model_type", "kimi_k2"}, {"vocab_size", 163840}, {"hidden_size", 7168}, {"intermediate_size", 18432},
      {"moe_intermediate_size", 2048}, {"num_hidden_layers", 61}, {"num_attention_heads", 64},
      {"num_key_value_heads", 64}, {"q_lora_rank", 1536}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},
      {"qk_rope_head_dim", 64}, {"v_head_dim", 128}, {"n_routed_experts", 384}, {"n_shared_experts", 1},
      {"num_experts_per_tok", 8}, {"first_k_dense_replace", 1}, {"n_group", 1}, {"topk_group", 1},
      {"norm_topk_prob", true}, {"routed_scaling_factor", 2.827}, {"scoring_func", "sigmoid"},
      {"topk_method", "noaux_tc"}, {"max_position_embeddings", 262144}, {"rms_norm_eps", 1e-5},
      {"rope_theta", 50000.0},
      {"rope_scaling", {{"type", "yarn"}, {"factor", 64.0}, {"original_max_position_embeddings", 4096},
                        {"beta_fast", 1.0}, {"beta_slow", 1.0}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}}};
  io::ModelSpec p = io::parse_config(cfg, "kimi config");
  p.num_layers = 3;
  EXPECT_EQ(p.model_type, k.model_type);
  for (auto [a, b] : {std::pair{p.vocab_size, k.vocab_size}, {p.hidden_size, k.hidden_size},
                      {p.intermediate_size, k.intermediate_size}, {p.moe_intermediate_size, k.moe_intermediate_size},
                      {p.num_heads, k.num_heads}, {p.num_kv_heads, k.num_kv_heads}, {p.head_dim, k.head_dim},
                      {p.num_experts, k.num_experts}, {p.top_k, k.top_k}, {p.first_k_dense_replace, k.first_k_dense_replace},
                      {p.n_group, k.n_group}, {p.topk_group, k.topk_group}, {p.num_shared_experts, k.num_shared_experts},
                      {p.shared_expert_intermediate_size, k.shared_expert_intermediate_size},
                      {p.max_position_embeddings, k.max_position_embeddings}, {p.mla.q_lora_rank, k.mla.q_lora_rank},
                      {p.mla.kv_lora_rank, k.mla.kv_lora_rank}, {p.mla.qk_nope_head_dim, k.mla.qk_nope_head_dim},
                      {p.mla.qk_rope_head_dim, k.mla.qk_rope_head_dim}, {p.mla.v_head_dim, k.mla.v_head_dim},
                      {p.mla.rope.original_max_position_embeddings, k.mla.rope.original_max_position_embeddings}})
    EXPECT_EQ(a, b);
  EXPECT_EQ(p.router_scoring, k.router_scoring);
  EXPECT_EQ(p.router_correction_bias, k.router_correction_bias);
  EXPECT_DOUBLE_EQ(p.routed_scaling_factor, k.routed_scaling_factor);
  EXPECT_DOUBLE_EQ(p.rms_norm_eps, k.rms_norm_eps);
  EXPECT_EQ(p.mla.rope.type, k.mla.rope.type);
  EXPECT_DOUBLE_EQ(p.mla.rope.theta, k.mla.rope.theta);
  EXPECT_DOUBLE_EQ(p.mla.rope.factor, k.mla.rope.factor);
  EXPECT_DOUBLE_EQ(p.mla.softmax_scale, k.mla.softmax_scale);
  EXPECT_EQ(p.mla.rope_interleave, k.mla.rope_interleave);
  EXPECT_THROW(runtime::synthetic_spec("kimi-k2.5", 62), Error);
}

TEST(RuntimeOpsRef, RmsNormTwinMatchesModelRmsnormRows) {
  const int64_t n = 3, D = 2048;
  std::mt19937_64 g(1);
  std::normal_distribution<float> d(0.2f, 1.5f);
  std::vector<float> x(n * D), w(D), y(n * D);
  for (auto& v : x) v = d(g);
  for (auto& v : w) v = 1.0f + 0.1f * d(g);
  std::vector<uint16_t> yb(n * D);
  ops::RmsNormArgs a;
  a.x = x.data(), a.w = w.data(), a.y = yb.data(), a.n = n, a.D = D, a.eps = 1e-6;
  ops::rmsnorm_ref(a);
  model::rmsnorm_rows(x.data(), n, D, w.data(), 1e-6, y.data());
  for (int64_t i = 0; i < n * D; ++i)
    ASSERT_LE(std::fabs(bf16_to_f32(yb[i]) - y[i]), kBf16Rel * std::fabs(y[i]) + 1e-30) << "index " << i;
}

TEST(RuntimeOpsRef, QkRopeTwinMatchesModelNormAndRope) {
  const int nh = 2, nkv = 1, hd = 64, T = 3;
  const int64_t max_len = 8, W = (nh + 2 * nkv) * hd;
  std::mt19937_64 g(2);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> qkv(T * W), qn(hd), kn(hd);
  for (auto& v : qkv) v = d(g);
  for (auto& v : qn) v = 1.0f + 0.1f * d(g);
  for (auto& v : kn) v = 1.0f + 0.1f * d(g);
  std::vector<float> cs, sn;
  model::rope_tables(max_len, hd, 10000.0, cs, sn);
  const std::vector<int32_t> slot = {0, 0, 0}, pos = {0, 5, 7};
  std::vector<float> q(T * nh * hd);
  std::vector<uint16_t> kc(max_len * nkv * hd), vc(max_len * nkv * hd);
  ops::QkRopeArgs a;
  a.qkv = qkv.data(), a.q_norm = qn.data(), a.k_norm = kn.data(), a.cos = cs.data(), a.sin = sn.data();
  a.tok_slot = slot.data(), a.tok_pos = pos.data(), a.q_out = q.data(), a.k_cache = kc.data(), a.v_cache = vc.data();
  a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len;
  ops::qk_rope_ref(a);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nh; ++h) {
      std::vector<float> v(hd);
      model::rmsnorm_rows(&qkv[(t * (nh + 2 * nkv) + h) * hd], 1, hd, qn.data(), 1e-6, v.data());
      model::apply_rope(v.data(), hd, &cs[pos[t] * hd / 2], &sn[pos[t] * hd / 2]);
      for (int c = 0; c < hd; ++c)
        ASSERT_NEAR(q[(t * nh + h) * hd + c], v[c], 1e-5 * (1 + std::fabs(v[c]))) << "t=" << t << " h=" << h << " c=" << c;
    }
}

// The other families' q/k paths in the qk_rope twin against the model's own functions (the CPU
// attention's order: + bias, RMSNorm, RoPE): OLMoE's RMSNorm over the whole q [nh·hd] and k [nkv·hd]
// projections, Qwen2-MoE's q/k/v biases without a norm, Mixtral's plain RoPE; head_dim 32 as in the
// family fixtures. q and k (fp32 rows, k_out) within fp32 rounding; v is the biased row exactly.
TEST(RuntimeOpsRef, QkRopeTwinBiasesAndWholeNormMatchTheModel) {
  const int nh = 4, nkv = 2, hd = 32, T = 3, heads = nh + 2 * nkv;
  const int64_t max_len = 8, W = heads * hd;
  std::mt19937_64 g(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> qkv(T * W), bias(W), qn(nh * hd), kn(nkv * hd);
  for (auto& v : qkv) v = d(g);
  for (auto& v : bias) v = 0.3f * d(g);
  for (auto& v : qn) v = 1.0f + 0.1f * d(g);
  for (auto& v : kn) v = 1.0f + 0.1f * d(g);
  std::vector<float> cs, sn;
  model::rope_tables(max_len, hd, 10000.0, cs, sn);
  const std::vector<int32_t> pos = {0, 5, 7};
  enum Mode { kWholeNorm, kBiasNoNorm, kPlain };
  for (Mode mode : {kWholeNorm, kBiasNoNorm, kPlain}) {
    std::vector<float> q(T * nh * hd), k(T * nkv * hd), v(T * nkv * hd);
    ops::QkRopeArgs a;
    a.qkv = qkv.data(), a.cos = cs.data(), a.sin = sn.data(), a.tok_pos = pos.data(), a.q_out = q.data();
    a.k_out = k.data(), a.v_out = v.data(), a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len;
    if (mode == kWholeNorm) a.q_norm = qn.data(), a.k_norm = kn.data(), a.whole_qk_norm = true;
    if (mode == kBiasNoNorm) a.qkv_bias = bias.data();
    ops::qk_rope_ref(a);
    for (int t = 0; t < T; ++t) {
      std::vector<float> row(qkv.begin() + t * W, qkv.begin() + (t + 1) * W);
      if (mode == kBiasNoNorm) model::add_bias_rows(row.data(), 1, W, bias);
      if (mode == kWholeNorm) {
        model::rmsnorm_rows(row.data(), 1, nh * hd, qn.data(), 1e-6, row.data());
        model::rmsnorm_rows(row.data() + nh * hd, 1, nkv * hd, kn.data(), 1e-6, row.data() + nh * hd);
      }
      for (int h = 0; h < nh + nkv; ++h) model::apply_rope(row.data() + h * hd, hd, &cs[pos[t] * hd / 2], &sn[pos[t] * hd / 2]);
      for (int c = 0; c < nh * hd; ++c)
        ASSERT_NEAR(q[t * nh * hd + c], row[c], 1e-5 * (1 + std::fabs(row[c]))) << "mode " << mode << " t=" << t << " q " << c;
      for (int c = 0; c < nkv * hd; ++c) {
        ASSERT_NEAR(k[t * nkv * hd + c], row[nh * hd + c], 1e-5 * (1 + std::fabs(row[nh * hd + c])))
            << "mode " << mode << " t=" << t << " k " << c;
        ASSERT_EQ(v[t * nkv * hd + c], row[(nh + nkv) * hd + c]) << "mode " << mode << " t=" << t << " v " << c;
      }
    }
  }
}

TEST(RuntimeOpsRef, RouterTwinMatchesQwen3MoeRoute) {
  const io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  const model::DecoderModel cpu(ckpt);
  const auto& s = cpu.spec();
  const int64_t n = 16, H = s.hidden_size;
  std::mt19937_64 g(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n * H);
  for (auto& v : x) v = d(g);
  const model::Routes r = cpu.route(0, x, n);
  std::vector<int32_t> ids(n * s.top_k);
  std::vector<float> w(n * s.top_k);
  ops::RouterTopkArgs a;
  a.logits = r.logits.data(), a.topk_ids = ids.data(), a.topk_w = w.data(), a.T = n;
  a.num_experts = static_cast<int>(s.num_experts), a.topk = static_cast<int>(s.top_k), a.norm_topk_prob = s.norm_topk_prob;
  ops::router_topk_ref(a);
  EXPECT_EQ(ids, r.expert);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], r.weight[i], 1e-6) << "route " << i;
}

// The DeepSeek-V3 fixture's sigmoid router (correction bias, 4 groups of 4 experts with 2 kept,
// × 2.5) through the engine's path — moe_block_dims' router fields and load_host_moe's
// e_score_correction_bias given to the router twin — routes as the CPU model does, bit for bit.
TEST(RuntimeOpsRef, RouterTwinMatchesDeepSeekV3Route) {
  const io::Checkpoint ckpt(std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3");
  const model::DecoderModel cpu(ckpt);
  const auto& s = cpu.spec();
  int64_t l = 0;
  while (!s.is_moe_layer(l)) ++l;
  const runtime::MoeBlockDims dm = runtime::moe_block_dims(s);
  ASSERT_TRUE(dm.sigmoid_router && dm.correction_bias);
  ASSERT_GT(dm.n_group, 1);
  const runtime::HostMoe hm =
      runtime::load_host_moe(ckpt, io::read_quantization_config(ckpt), runtime::ExpertBackend::kBf16, l);
  ASSERT_EQ(static_cast<int64_t>(hm.correction_bias.size()), s.num_experts);
  const int64_t n = 32, H = s.hidden_size;
  std::mt19937_64 g(4);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n * H);
  for (auto& v : x) v = d(g);
  const model::Routes r = cpu.route(l, x, n);
  std::vector<int32_t> ids(n * s.top_k);
  std::vector<float> w(n * s.top_k);
  ops::RouterTopkArgs a;
  a.logits = r.logits.data(), a.topk_ids = ids.data(), a.topk_w = w.data(), a.T = n;
  a.num_experts = static_cast<int>(dm.E), a.topk = static_cast<int>(dm.top_k), a.norm_topk_prob = dm.norm_topk_prob;
  a.sigmoid = dm.sigmoid_router, a.correction_bias = hm.correction_bias.data(), a.n_group = dm.n_group;
  a.topk_group = dm.topk_group, a.routed_scaling_factor = dm.routed_scaling_factor;
  ops::router_topk_ref(a);
  EXPECT_EQ(ids, r.expert);
  EXPECT_EQ(w, r.weight);
}

// A family is GPU-supported when each of its blocks is; a refused one is named with what is missing,
// block by block, before any tensor is read.
TEST(RuntimeWeights, FamiliesAreSupportedBlockByBlock) {
  EXPECT_TRUE(runtime::supports(io::Checkpoint(MOESQ_DEFAULT_MODEL).spec()));
  EXPECT_TRUE(runtime::supports(runtime::synthetic_spec("qwen3-235b-a22b", 2)));
  const std::string fam = std::string(MOESQ_FIXTURES) + "/families/";
  // Mixtral (no q/k norm), OLMoE (whole-projection q/k norm, no renormalisation), Qwen2-MoE (q/k/v
  // biases, a gated shared expert, a dense layer), DeepSeek-V3 (MLA, sigmoid grouped router, shared
  // expert, a first dense layer), gpt-oss (sink attention, sliding layers, YaRN, biased top-k-softmax
  // router, biased clamped experts): every block runs, and the whole model loads.
  for (const char* dir : {"tiny-mixtral", "tiny-olmoe", "tiny-qwen2-moe", "tiny-deepseek-v3", "tiny-gpt-oss"}) {
    const io::Checkpoint ck(fam + dir);
    EXPECT_TRUE(runtime::supports(ck.spec())) << dir << ": " << runtime::gpu_refusal(ck.spec());
    const runtime::HostModel m = runtime::load_host_model(ck, runtime::ExpertBackend::kAuto);
    EXPECT_EQ(static_cast<int64_t>(m.layers.size()), ck.spec().num_layers) << dir;
  }
  // Qwen3-Next and Qwen3.5 (hybrids): Gated DeltaNet layers where layer_types says linear_attention, the
  // gated attention (q heads [query | gate], partial RoPE) on the others, zero-centred norms folded.
  for (const char* dir : {"tiny-qwen3-next", "tiny-qwen3.5-moe"}) {
    const io::Checkpoint ck(fam + dir);
    EXPECT_TRUE(runtime::supports(ck.spec())) << dir << ": " << runtime::gpu_refusal(ck.spec());
    const io::FamilySpec f = io::parse_family_config(ck.config(), ck.dir() + "/config.json");
    const runtime::HostModel m = runtime::load_host_model(ck, runtime::ExpertBackend::kAuto);
    ASSERT_EQ(static_cast<int64_t>(m.layers.size()), ck.spec().num_layers) << dir;
    const runtime::GdnBlockDims& d = m.gdn;
    EXPECT_EQ(d.nk, f.linear_num_key_heads) << dir;
    EXPECT_EQ(d.Kc, f.linear_conv_kernel) << dir;
    EXPECT_EQ(static_cast<int64_t>(m.rope.inv_freq.size()), f.rope.rotary_dim / 2) << dir;
    int gdn = 0, attn = 0;
    const std::vector<float> raw_final = ck.get_f32(io::kFinalNorm, {ck.spec().hidden_size});
    EXPECT_EQ(m.final_norm[0], 1.0f + raw_final[0]) << dir << ": the final norm's 1 + w";
    for (int64_t l = 0; l < ck.spec().num_layers; ++l) {
      const runtime::HostLayer& L = m.layers[l];
      EXPECT_EQ(L.is_gdn, f.layer_mixer[l] == io::MixerKind::GatedDeltaNet) << dir << " layer " << l;
      if (L.is_gdn) {
        ++gdn;
        EXPECT_EQ(static_cast<int64_t>(L.gdn.in_proj.size()), d.proj_cols() * d.H) << dir << " layer " << l;
        EXPECT_EQ(static_cast<int64_t>(L.gdn.out_proj.size()), d.H * d.value_dim()) << dir << " layer " << l;
        EXPECT_EQ(static_cast<int64_t>(L.gdn.conv1d.size()), d.conv_dim() * d.Kc) << dir << " layer " << l;
        EXPECT_TRUE(L.attn.qkv.empty());
      } else {
        ++attn;
        EXPECT_TRUE(L.attn.output_gate) << dir << " layer " << l;
        EXPECT_EQ(L.attn.rotary_dim, f.rope.rotary_dim) << dir << " layer " << l;
        const int64_t hd = ck.spec().head_dim, nh = ck.spec().num_heads, nkv = ck.spec().num_kv_heads;
        EXPECT_EQ(static_cast<int64_t>(L.attn.qkv.size()), (2 * nh + 2 * nkv) * hd * ck.spec().hidden_size);
        EXPECT_EQ(static_cast<int64_t>(L.attn.q_norm.size()), hd);
      }
    }
    EXPECT_GT(gdn, 0) << dir;
    EXPECT_GT(attn, 0) << dir;
  }
  // What the Gated DeltaNet block refuses, by name.
  io::FamilySpec f;
  f.base.hidden_size = 64, f.linear_num_key_heads = 2, f.linear_num_value_heads = 4, f.linear_conv_kernel = 4;
  f.linear_key_head_dim = 32, f.linear_value_head_dim = 32;
  EXPECT_EQ(runtime::gdn_block_refusal(f), "");
  f.linear_key_head_dim = 48;
  EXPECT_NE(runtime::gdn_block_refusal(f).find("linear_key_head_dim 48"), std::string::npos);
  f.linear_key_head_dim = 32, f.linear_conv_kernel = 9;
  EXPECT_NE(runtime::gdn_block_refusal(f).find("linear_conv_kernel_dim 9"), std::string::npos);
  f.linear_conv_kernel = 4, f.linear_num_value_heads = 3;
  EXPECT_NE(runtime::gdn_block_refusal(f).find("not a multiple of its key heads"), std::string::npos);
  // The MoE blocks of these families run on the GPU (a sigmoid router with groups, bias and scaling;
  // shared experts with and without their gate; dense MLP layers): only their attention is refused.
  for (const char* dir : {"tiny-qwen2-moe", "tiny-deepseek-v3", "tiny-mixtral", "tiny-olmoe", "tiny-qwen3-next"}) {
    const std::string why = runtime::gpu_refusal(io::Checkpoint(fam + dir).spec());
    EXPECT_EQ(why.find("MoE block"), std::string::npos) << dir << ": " << why;
  }
}

// The dense-MLP path of the GPU MoE block (moe_block.h: gate|up GEMM, ops::dense_swiglu, down GEMM),
// evaluated here on the CPU from the host layout load_host_moe / load_host_dense_layer produce (gate
// rows, up rows, then the shared expert's gate row; down [H, I]), equals the CPU model's shared
// expert with its sigmoid gate (layer 0) and dense MLP (layer 1, mlp_only_layers) on the Qwen2-MoE
// fixture. Its weights are bf16, so only the hi + lo activations and σ folded in before the down
// projection (instead of after) differ: a few 2^-17 relative.
TEST(RuntimeWeights, DenseMlpLayoutComputesTheModelsSharedExpertAndDenseMlp) {
  constexpr double kRelTol = 1e-4;
  const io::Checkpoint ckpt(std::string(MOESQ_FIXTURES) + "/families/tiny-qwen2-moe");
  const model::DecoderModel cpu(ckpt);
  const io::ModelSpec& s = cpu.spec();
  const runtime::MoeBlockDims dm = runtime::moe_block_dims(s);
  EXPECT_EQ(dm.mlp_I, std::max(s.shared_expert_intermediate_size, s.intermediate_size));
  EXPECT_TRUE(dm.shared_gated);
  runtime::MoeBlockDims no_mlp = dm;
  no_mlp.mlp_I = 0;
  EXPECT_GE(runtime::moe_workspace_bytes(dm, 8),
            runtime::moe_workspace_bytes(no_mlp, 8) + 8 * (2 * dm.mlp_I + 1) * 4 + 2 * 8 * dm.mlp_I * 2);
  const int64_t n = 5, H = s.hidden_size;
  std::mt19937_64 g(8);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n * H);
  for (auto& v : x) v = d(g);
  const io::QuantizationConfig q = io::read_quantization_config(ckpt);
  for (int64_t l : {0, 1}) {
    ASSERT_EQ(s.is_moe_layer(l), l == 0);
    const runtime::HostMoe hm =
        s.is_moe_layer(l) ? runtime::load_host_moe(ckpt, q, runtime::ExpertBackend::kBf16, l)
                          : runtime::load_host_dense_layer(ckpt, l);
    const runtime::HostDenseMlp& m = hm.mlp;
    EXPECT_EQ(m.gated, l == 0);
    EXPECT_EQ(m.I, l == 0 ? s.shared_expert_intermediate_size : s.intermediate_size);
    EXPECT_EQ(hm.experts == nullptr, l == 1);
    const int64_t I = m.I, N = 2 * I + (m.gated ? 1 : 0);
    ASSERT_EQ(static_cast<int64_t>(m.gate_up.size()), N * H);
    ASSERT_EQ(static_cast<int64_t>(m.down.size()), H * I);
    std::vector<float> gu(n * N);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0.0;
        for (int64_t k = 0; k < H; ++k) acc += static_cast<double>(x[t * H + k]) * bf16_to_f32(m.gate_up[j * H + k]);
        gu[t * N + j] = static_cast<float>(acc);
      }
    std::vector<uint16_t> a(n * I), a_lo(n * I);
    ops::DenseSwigluArgs sw;
    sw.gu = gu.data(), sw.a = a.data(), sw.a_lo = a_lo.data(), sw.T = n, sw.I = I, sw.ld = N, sw.gated = m.gated;
    ops::dense_swiglu_ref(sw);
    const std::vector<float> want = l == 0 ? cpu.shared_expert_forward(l, x, n) : cpu.dense_mlp(l, x, n);
    double scale = 0.0;
    for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
    ASSERT_GT(scale, 0.0);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H; ++h) {
        double y = 0.0;
        for (int64_t i = 0; i < I; ++i)
          y += (static_cast<double>(bf16_to_f32(a[t * I + i])) + bf16_to_f32(a_lo[t * I + i])) *
               bf16_to_f32(m.down[h * I + i]);
        ASSERT_NEAR(y, want[t * H + h], kRelTol * scale) << "layer " << l << " token " << t << " column " << h;
      }
  }
}

// Sliding-window attention runs on the GPU (ops::AttentionArgs::window): a spec with sliding layers is
// supported. gpt-oss's layers carry what its CPU mixer reads (model/mixers/sink_attention.cpp): the
// window of its sliding_attention layers only, one sink per head, the o_proj bias, q|k|v biases in the
// fused order, and YaRN frequencies with their attention factor for the RoPE tables.
TEST(RuntimeWeights, SlidingWindowsSinksAndBiasesReachTheHostLayers) {
  io::ModelSpec s = io::Checkpoint(MOESQ_DEFAULT_MODEL).spec();
  s.attention_window.assign(static_cast<size_t>(s.num_layers), 0);
  s.attention_window[1] = 16;
  EXPECT_TRUE(runtime::supports(s)) << runtime::gpu_refusal(s);
  const io::Checkpoint ck(std::string(MOESQ_FIXTURES) + "/families/tiny-gpt-oss");
  const io::FamilySpec f = io::parse_family_config(ck.config(), ck.dir() + "/config.json");
  const io::ModelSpec& g = ck.spec();
  const runtime::HostModel m = runtime::load_host_model(ck, runtime::ExpertBackend::kAuto);
  ASSERT_EQ(static_cast<int64_t>(m.layers.size()), g.num_layers);
  int sliding = 0;
  for (int64_t l = 0; l < g.num_layers; ++l) {
    const runtime::HostAttention& a = m.layers[l].attn;
    const bool is_sliding = f.layer_mixer.at(l) == io::MixerKind::SlidingAttention;
    sliding += is_sliding;
    EXPECT_EQ(a.window, is_sliding ? f.sliding_window : 0) << "layer " << l;
    EXPECT_EQ(static_cast<int64_t>(a.sinks.size()), g.num_heads) << "layer " << l;
    EXPECT_EQ(static_cast<int64_t>(a.o_bias.size()), g.hidden_size) << "layer " << l;
    EXPECT_EQ(static_cast<int64_t>(a.qkv_bias.size()), (g.num_heads + 2 * g.num_kv_heads) * g.head_dim) << "layer " << l;
    EXPECT_EQ(a.sinks, ck.get_f32(io::layer_tensor(l, "self_attn.sinks"), {g.num_heads})) << "layer " << l;
    EXPECT_EQ(a.o_bias, ck.get_f32(io::layer_tensor(l, "self_attn.o_proj.bias"), {g.hidden_size})) << "layer " << l;
    const std::vector<float> kb = ck.get_f32(io::layer_tensor(l, "self_attn.k_proj.bias"), {g.num_kv_heads * g.head_dim});
    EXPECT_TRUE(std::equal(kb.begin(), kb.end(), a.qkv_bias.begin() + g.num_heads * g.head_dim)) << "layer " << l;
  }
  EXPECT_GT(sliding, 0);
  EXPECT_EQ(static_cast<int64_t>(m.rope.inv_freq.size()), g.head_dim / 2);
  EXPECT_NE(m.rope.attention_factor, 1.0f) << "YaRN's attention factor";
  EXPECT_EQ(m.rope.inv_freq, model::rope_frequencies(f.rope).inv_freq);
}

// gpt-oss's MoE layers on the GPU: the router logit bias and the expert biases are loaded, the gate|up
// biases de-interleaved into the gate|up GEMM's column order (gate [I], then up [I]); the bf16 backend
// reads the fused expert tensors; MoeBlockDims carries the router and SwiGLU variants.
TEST(RuntimeWeights, GptOssMoeLayerCarriesBiasesAndVariants) {
  const io::Checkpoint ck(std::string(MOESQ_FIXTURES) + "/families/tiny-gpt-oss");
  const io::ModelSpec& s = ck.spec();
  const int64_t E = s.num_experts, I = s.moe_intermediate_size, H = s.hidden_size;
  const runtime::HostMoeLayer m = runtime::load_host_moe_layer(ck, 0, runtime::ExpertBackend::kAuto);
  EXPECT_EQ(m.backend, runtime::ExpertBackend::kBf16);
  EXPECT_EQ(static_cast<int64_t>(m.weights.router_logit_bias.size()), E);
  ASSERT_EQ(static_cast<int64_t>(m.weights.expert_gate_up_bias.size()), E * 2 * I);
  ASSERT_EQ(static_cast<int64_t>(m.weights.expert_down_bias.size()), E * H);
  const model::DecoderModel cpu(ck);
  for (int64_t e = 0; e < E; e += 3) {
    const model::ExpertWeights& w = cpu.layer(0).experts.at(e);
    for (int64_t i = 0; i < I; ++i) {
      ASSERT_EQ(m.weights.expert_gate_up_bias[e * 2 * I + i], w.gate_bias[i]) << "expert " << e << " gate " << i;
      ASSERT_EQ(m.weights.expert_gate_up_bias[e * 2 * I + I + i], w.up_bias[i]) << "expert " << e << " up " << i;
    }
    EXPECT_TRUE(std::equal(w.down_bias.begin(), w.down_bias.end(), m.weights.expert_down_bias.begin() + e * H));
  }
  const runtime::MoeBlockDims d = runtime::moe_block_dims(s);
  EXPECT_TRUE(d.topk_softmax && d.router_logit_bias && d.expert_bias && d.clamped_swiglu);
  EXPECT_FLOAT_EQ(d.swiglu_limit, static_cast<float>(s.swiglu_limit));
}

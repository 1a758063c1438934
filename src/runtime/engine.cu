// The GPU engine (engine.h). One stream; activation buffers sized once for max_tokens; a forward of T
// tokens uses expert capacity T (an expert receives at most one route per token), so no route is ever
// dropped and the host never reads the device-side counts. The non-expert GEMMs take their bf16
// inputs as hi + lo pairs (ops::gemm_bf16 x_lo): near-fp32 inputs at the cost of a second MMA. A layer
// is two blocks: layers/attention_block, then post-attention RMSNorm and layers/moe_block.
#include "runtime/engine.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/cuda/pdl.cuh"
#include "core/cuda/require_device.h"
#include "model/mixers/mla.h"
#include "model/rope.h"
#include "model/tensor_math.h"
#include "ops/argmax/argmax.h"
#include "ops/attention/attention.h"
#include "ops/embed/embed.h"
#include "ops/finite_check/finite_check.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/qk_rope/qk_rope.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/synth_pack/synth_pack.h"
#include "runtime/layers/attention_block_device.cuh"
#include "runtime/layers/gdn_block_device.cuh"
#include "io/import_checkpoint.h"
#include "runtime/experts/registry.h"
#include "runtime/finite_check.h"
#include "runtime/kv_blocks.h"
#include "runtime/layers/mla_block_device.cuh"
#include "runtime/layers/moe_block_device.cuh"

namespace moesq::runtime {

namespace {

struct DevLayer {
  DeviceAttentionLayer attn;  // input norm, q|k|v, q/k norms, o_proj, KV cache (GQA families)
  DeviceMlaLayer mla;         // input norm, MLA projections, latent cache (spec.mla: DeepSeek-V3, Kimi-K2)
  DeviceGdnLayer gdn;         // input norm, Gated DeltaNet weights and per-slot state (a hybrid's linear_attention layer)
  bool is_gdn = false;
  DevBuf<float> post_norm;    // [H]
  DeviceMoeLayer moe;         // router + experts of the engine's backend
};

}  // namespace

struct Engine::Impl {
  HostModel host;  // weights are dropped after upload; spec and flags stay
  io::ModelSpec s;
  int max_seqs = 1;
  int64_t max_len = 0, max_tokens = 0;
  int64_t H = 0, hd = 0, nh = 0, nkv = 0, E = 0, V = 0, qkv_w = 0;
  MoeBlockDims moe_dims;    // the routed experts this rank runs: moe_dims.expert_begin / expert_end
  ExpertExchange exchange;  // EngineOptions::exchange (a sharded moe_dims only)
  bool is_mla = false;  // spec.mla.kv_lora_rank > 0: every layer's attention is the MLA block
  MlaBlockDims mla_dims;
  // Qwen3-Next / Qwen3.5: Gated DeltaNet layers beside gated attention ones (q heads [query | gate],
  // partial RoPE over rot dims). gdn_runs: the runs of the current call's tokens per slot (forward: one
  // per slot; decode: one per token), set before run(); gdn_update: false in the eager step before a capture.
  bool is_hybrid = false;
  GdnBlockDims gdn_dims;
  int rot = 0;
  int gdn_runs = 0;
  bool gdn_update = true;
  DevBuf<int32_t> gdn_run_start, gdn_run_slot;  // [max_tokens + 1], [max_tokens]
  DevBuf<float> gdn_proj, gdn_qkv;              // [T, proj_cols], [T, C]
  DevBuf<uint16_t> gdn_o, gdn_o_lo;             // [T, nv·dv] bf16 hi + lo (out_proj's input)
  cudaStream_t stream = nullptr;
  bool deterministic = true;
  cublasHandle_t cublas = nullptr;  // deterministic == false only
  DevBuf<uint8_t> cublas_ws;        // fixed cuBLAS workspace (graph capture allocates nothing)
  std::vector<DevLayer> layers;
  DevBuf<uint16_t> embed, lm_head;
  DevBuf<float> final_norm, rope_cos, rope_sin;
  // activations, [max_tokens, ·] unless noted
  DevBuf<int32_t> tok_ids, tok_slot, tok_pos, out_rows, next_ids, attn_tiles;
  DevBuf<float> attn_partial;  // split-KV partials of a decode step (ops::attention)
  DevBuf<float> gemm_split;    // K-sliced partials of the q|k|v and o_proj GEMMs (gemm_bf16 split_ws)
  DevBuf<float> h, qkv, q, logits;
  // MLA activations (mla_block_device.cuh): fused GEMM out [T, a_cols], q [T, nh·d_qk], attention
  // queries [nh, T, r_kv + rope], head outputs [nh, T, v]; bf16 hi/lo: q_a [T, r_q], q_nope [nh, T, nope],
  // o_lat [nh, T, r_kv]; RoPE tables of the rope dims [max_len, rope/2].
  DevBuf<float> mla_a, mla_q, mla_q_att, mla_o_heads, mla_cos, mla_sin;
  DevBuf<uint16_t> mla_qa, mla_qa_lo, mla_q_nope, mla_q_nope_lo, mla_o_lat, mla_o_lat_lo;
  DevBuf<float> mla_partial;  // split-KV partials of mla_attention for calls of at most mla_split_T tokens
  int64_t mla_split_T = 0;
  DevBuf<uint16_t> xb, attn, xsel, xb_lo, attn_lo, xsel_lo;  // *_lo: bf16 residues (hi + lo split inputs)
  DevBuf<uint8_t> moe_ws;     // moe_block scratch for moe_T tokens (moe_workspace_bytes)
  MoeBlockBuffers moe_bufs;   // carved from moe_ws, used with capacity T ≤ moe_T
  int64_t moe_T = 0;          // tokens per moe_block call: a forward's rows go through the MoE in slices of moe_T
  int64_t moe_tokens_opt = 0; // EngineOptions::moe_tokens
  std::vector<int64_t> lengths;         // [slots]
  int64_t kv_tokens_opt = 0;            // EngineOptions::kv_tokens
  std::unique_ptr<KvBlockPool> kv;      // paged KV: which blocks each slot holds
  DevBuf<int32_t> block_table;          // device copy of kv->table()
  uint64_t table_version = ~uint64_t(0);  // kv->version() of the device copy
  size_t weight_bytes = 0, kv_bytes = 0;
  bool timing = false;
  double attn_ms = 0, moe_ms = 0;
  std::vector<cudaEvent_t> events;
  std::map<int, cudaGraphExec_t> graphs;  // decode graph per batch size
  bool check_finite = false;              // EngineOptions::check_finite
  bool gdn_walk_prefill = false;          // EngineOptions::gdn_walk_prefill
  DevBuf<uint64_t> finite_record;         // [1] ops::finite_check record (allocated when first switched on)

  void upload(HostModel&& m, const EngineOptions& opt);
  void sizes(const EngineOptions& opt);
  void activations();
  void synthesize(uint64_t seed);
  void alloc_kv();  // the block pool and every layer's K/V blocks, after the weights and activations
  // Grows the slots of `want` to hold their lengths (KvCacheFull: nothing changed) and uploads the
  // block table when it moved (before the forward or graph that reads it).
  void grow_kv(const std::vector<std::pair<int, int64_t>>& want);
  // All kernels of one forward on tok_* (device), logits of out_rows. n_tiles > 0: prefill attention
  // over attn_tiles; 0: split-KV attention (decode). Both give a row the same bits (attention.h).
  // identity_rows: out_rows is 0..T−1 (n_out = T), so the lm_head reads the final norm's rows directly.
  void run(int64_t T, int64_t n_out, int64_t n_tiles, bool identity_rows);
  MlaCall make_mla_call(int64_t T);         // the MLA block's descriptors for T tokens on tok_*
  GdnCall make_gdn_call(int64_t T);         // the Gated DeltaNet block's, on gdn_run_* (gdn_runs runs)
  // The runs of T tokens whose slots are `slot` (consecutive tokens of a slot form one run): uploads
  // gdn_run_start / gdn_run_slot and sets gdn_runs. Error: a slot in two runs of one call.
  void set_gdn_runs(const std::vector<int32_t>& slot);
  void linear(const ops::GemmBf16Args& g);  // gemm_bf16, or cuBLAS when !deterministic
  // --check-finite (runtime/finite_check.h): the switch, the launches of one stage, the read-back.
  void set_check_finite(bool on);
  // row0: the first row's index in the forward (a MoE slice), added to the reported token.
  void check_rows(FiniteStage stage, int64_t l, const float* x, int64_t rows, int64_t cols, int64_t row0 = 0);
  void check_experts(FiniteStage stage, int64_t l, const float* x_f32, const uint16_t* x_bf16, int64_t T, int64_t cols,
                     int64_t row0);
  void check_moe_layer(int64_t l, int64_t t0, int64_t T);  // the slice of rows [t0, t0 + T)
  void read_finite_record(uint64_t* host);  // enqueued before the forward's sync
  [[noreturn]] void throw_non_finite(uint64_t key, const FiniteRows& rows);
  ~Impl() {
    if (cublas) cublasDestroy(cublas);
    for (auto& [b, g] : graphs) cudaGraphExecDestroy(g);
    for (auto e : events) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  }
};

void Engine::Impl::sizes(const EngineOptions& opt) {
  H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads, E = s.num_experts;
  is_hybrid = host.gdn.H > 0;
  gdn_dims = host.gdn;
  V = s.vocab_size, qkv_w = ((is_hybrid ? 2 * nh : nh) + 2 * nkv) * hd;  // hybrid: q heads are [query | gate]
  moe_dims = moe_block_dims(s);
  if (opt.expert_begin != 0 || opt.expert_end != 0) {
    MOESQ_CHECK(opt.expert_begin >= 0 && opt.expert_begin <= opt.expert_end && opt.expert_end <= E,
                "engine: expert shard [", opt.expert_begin, ", ", opt.expert_end, ") outside the model's ", E,
                " routed experts");
    moe_dims.expert_begin = opt.expert_begin, moe_dims.expert_end = opt.expert_end;
  }
  if (moe_dims.sharded()) {
    MOESQ_CHECK(opt.exchange.all_reduce_sum && H % 2 == 0, "engine: experts [", opt.expert_begin, ", ",
                opt.expert_end, ") of ", E, " sharded without an exchange", H % 2 ? " (or with an odd hidden size)" : "");
    MOESQ_CHECK(moe_dims.shard_size() > 0, "engine: an empty expert shard [", opt.expert_begin, ", ", opt.expert_end, ")");
    // Every rank must compute the same bits outside its experts (the same routes, the same h), and hold
    // the same KV blocks (a KvCacheFull on one rank alone would leave the others in the exchange).
    MOESQ_CHECK(opt.deterministic, "engine: expert-parallel ranks need deterministic mode (cuBLAS may round a row "
                "differently on another rank, and the ranks would route apart)");
    MOESQ_CHECK(opt.kv_tokens != kKvTokensFitMemory, "engine: expert-parallel ranks need a fixed KV size "
                "(kv_tokens >= 0), not one fitted to each GPU's free memory");
    exchange = opt.exchange;
  }
  MOESQ_CHECK(opt.max_seqs >= 1, "engine: max_seqs must be >= 1");
  max_seqs = opt.max_seqs;
  max_len = opt.max_len > 0 ? opt.max_len : (s.max_position_embeddings > 0 ? s.max_position_embeddings : 4096);
  max_tokens = opt.max_tokens > 0 ? opt.max_tokens : max_seqs * max_len;
  MOESQ_CHECK(max_tokens <= (int64_t(1) << 20), "engine: max_tokens ", max_tokens, " too large");
  MOESQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  deterministic = opt.deterministic;
  kv_tokens_opt = opt.kv_tokens;
  MOESQ_CHECK(opt.moe_tokens >= 0, "engine: moe_tokens ", opt.moe_tokens, " must be >= 0");
  moe_tokens_opt = opt.moe_tokens;
  MOESQ_CHECK(kv_tokens_opt >= 0 || kv_tokens_opt == kKvTokensFitMemory, "engine: kv_tokens ", kv_tokens_opt,
              " must be >= 0 (or kKvTokensFitMemory)");
  set_check_finite(opt.check_finite);
  gdn_walk_prefill = opt.gdn_walk_prefill;
  std::vector<float> c, sn;
  is_mla = s.mla.kv_lora_rank > 0;
  if (is_mla) {
    mla_dims = mla_block_dims(s);
    mla_rope_tables(s, max_len, c, sn);
    mla_cos.upload(c);
    mla_sin.upload(sn);
    return;
  }
  // The family's RoPE (HostModel::rope: gpt-oss's YaRN), else default RoPE over the head (the same bits
  // as model::rope_tables(max_len, hd, rope_theta)).
  const model::RopeFrequencies freq =
      host.rope.inv_freq.empty() ? model::default_rope_frequencies(s.rope_theta, hd) : host.rope;
  rot = static_cast<int>(freq.inv_freq.size() * 2);  // partial RoPE: fewer than hd dims rotate
  model::rope_tables(max_len, freq, c, sn);
  rope_cos.upload(c);
  rope_sin.upload(sn);
}

void Engine::Impl::upload(HostModel&& m, const EngineOptions& opt) {
  s = m.spec;
  host.rope = m.rope;  // sizes() builds the RoPE tables from it
  host.gdn = m.gdn;    // and the hybrid's Gated DeltaNet shapes
  sizes(opt);
  embed.upload(m.embed);
  lm_head.upload(m.lm_head);
  final_norm.upload(m.final_norm);
  weight_bytes += embed.bytes() + lm_head.bytes() + final_norm.bytes();
  layers.resize(s.num_layers);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    HostLayer& hl = m.layers[l];
    DevLayer& L = layers[l];
    L.is_gdn = hl.is_gdn;
    if (is_mla)
      L.mla.upload(hl.mla);
    else if (L.is_gdn)
      L.gdn.upload(hl.gdn);
    else
      L.attn.upload(hl.attn);
    L.post_norm.upload(hl.post_norm);
    L.moe.upload(hl.moe, m.backend, moe_dims);
    weight_bytes += L.attn.weight_bytes() + L.mla.weight_bytes() + L.gdn.weight_bytes() + L.post_norm.bytes() +
                    L.moe.bytes();
    hl = HostLayer{};  // free host memory as we go
  }
  host = std::move(m);
  host.embed.clear(), host.lm_head.clear(), host.layers.clear();
  activations();
  alloc_kv();
}

void Engine::Impl::activations() {
  const size_t T = max_tokens;
  tok_ids.alloc(T), tok_slot.alloc(T), tok_pos.alloc(T), out_rows.alloc(T), next_ids.alloc(T), attn_tiles.alloc(2 * T);
  h.alloc(T * H), xb.alloc(T * H), xsel.alloc(T * H), xb_lo.alloc(T * H), xsel_lo.alloc(T * H);
  if (is_mla) {
    const MlaBlockDims& d = mla_dims;
    const int64_t nq = d.nh * d.d_qk(), nv = d.nh * d.v;
    gemm_split.alloc(std::max({ops::gemm_bf16_split_floats(T, d.a_cols(), H), ops::gemm_bf16_split_floats(T, nq, d.r_q),
                               ops::gemm_bf16_split_floats(T, H, nv)}));
    mla_a.alloc(T * d.a_cols()), mla_q_att.alloc(T * d.nh * d.latent_row()), mla_o_heads.alloc(T * nv);
    if (d.r_q > 0) mla_q.alloc(T * nq), mla_qa.alloc(T * d.r_q), mla_qa_lo.alloc(T * d.r_q);
    mla_q_nope.alloc(T * d.nh * d.nope), mla_q_nope_lo.alloc(T * d.nh * d.nope);
    mla_o_lat.alloc(T * d.nh * d.r_kv), mla_o_lat_lo.alloc(T * d.nh * d.r_kv);
    attn.alloc(T * nv), attn_lo.alloc(T * nv);
    // Split-KV workspace for decode-sized calls (both paths give the same bits, ops/mla/mla.h), at
    // most kMlaSplitBytes: up to max_seqs tokens, fewer when max_len's key ranges make a row large
    // (Kimi, 64 heads, 256-key ranges: 2.2 MB per token at max_len 4,352, so 240 tokens; 135 MB at 262,144).
    constexpr size_t kMlaSplitBytes = size_t(512) << 20;
    const size_t row = ops::mla_attention_partial_floats(1, static_cast<int>(d.nh), static_cast<int>(d.r_kv),
                                                         ops::mla_attention_ranges(max_len));
    mla_split_T = std::min<int64_t>(max_seqs, static_cast<int64_t>(kMlaSplitBytes / (row * sizeof(float))));
    if (mla_split_T > 0) mla_partial.alloc(static_cast<size_t>(mla_split_T) * row);
  } else {
    attn_partial.alloc(ops::attention_partial_floats(max_seqs, static_cast<int>(nh), static_cast<int>(hd), max_len));
    size_t split = std::max(ops::gemm_bf16_split_floats(T, qkv_w, H), ops::gemm_bf16_split_floats(T, H, nh * hd));
    if (is_hybrid) {
      const GdnBlockDims& d = gdn_dims;
      split = std::max({split, ops::gemm_bf16_split_floats(T, d.proj_cols(), H),
                        ops::gemm_bf16_split_floats(T, H, d.value_dim())});
      gdn_run_start.alloc(T + 1), gdn_run_slot.alloc(T);
      gdn_proj.alloc(T * d.proj_cols()), gdn_qkv.alloc(T * d.conv_dim());
      gdn_o.alloc(T * d.value_dim()), gdn_o_lo.alloc(T * d.value_dim());
    }
    gemm_split.alloc(split);
    qkv.alloc(T * qkv_w), q.alloc(T * nh * hd), attn.alloc(T * nh * hd), attn_lo.alloc(T * nh * hd);
  }
  // The MoE workspace holds capacity T per expert (E · T rows: no route is ever dropped); a forward's
  // rows go through the block in slices of moe_T tokens, the largest count whose workspace fits
  // kMoeWorkspaceBytes (Qwen3-30B-A3B: all 8,192 tokens of serve's default budget; Kimi-K2.5's 384
  // experts: ≈ 900). Every op of the block is batch-invariant, so slicing never changes a bit.
  constexpr size_t kMoeWorkspaceBytes = size_t(16) << 30;
  if (moe_tokens_opt > 0) {
    moe_T = std::min<int64_t>(moe_tokens_opt, max_tokens);
  } else {
    int64_t lo = 1, hi = max_tokens;  // workspace bytes grow with T: the largest T that fits (at least 1)
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (moe_workspace_bytes(moe_dims, mid) <= kMoeWorkspaceBytes) lo = mid; else hi = mid - 1;
    }
    moe_T = lo;
  }
  moe_ws.alloc(moe_workspace_bytes(moe_dims, moe_T));
  moe_bufs = carve_moe_workspace(moe_ws.p, moe_dims, moe_T);
  lengths.assign(max_seqs, 0);
  events.resize(4 * s.num_layers);
  for (auto& e : events) MOESQ_CUDA_CHECK(cudaEventCreate(&e));
  logits.alloc(static_cast<size_t>(max_tokens) * V);
}

void Engine::Impl::synthesize(uint64_t seed) {
  uint64_t stream_id = 0;  // every tensor its own hash stream
  const SeedFn next_seed = [&] { return seed ^ (++stream_id * 0xd1b54a32d192ed03ull); };
  constexpr float kScale = 0.02f;  // weight std: keeps the random residual stream tame
  auto bf16 = [&](DevBuf<uint16_t>& d, size_t n, float scale) {
    d.alloc(n);
    ops::SynthBf16Args a;
    a.out = d.p, a.n = static_cast<int64_t>(n), a.seed = next_seed(), a.scale = scale;
    ops::synth_bf16(a, stream);
    weight_bytes += d.bytes();
  };
  bf16(embed, V * H, 1.0f);
  bf16(lm_head, V * H, kScale);
  final_norm.upload(std::vector<float>(H, 1.0f));
  weight_bytes += final_norm.bytes();
  layers.resize(s.num_layers);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    DevLayer& L = layers[l];
    L.is_gdn = host.layers.size() > static_cast<size_t>(l) && host.layers[l].is_gdn;
    if (is_mla)
      L.mla.synthesize(mla_dims, next_seed, kScale, stream);
    else if (L.is_gdn)
      L.gdn.synthesize(gdn_dims, next_seed, kScale, stream);
    else
      L.attn.synthesize(s, next_seed, kScale, stream, is_hybrid);
    L.post_norm.upload(std::vector<float>(H, 1.0f));
    if (s.is_moe_layer(l)) {
      L.moe.synthesize(moe_dims, host.backend, next_seed, kScale, stream);
      if (s.num_shared_experts > 0)
        L.moe.synthesize_mlp(H, s.shared_expert_intermediate_size, s.shared_expert_gate, next_seed, kScale, stream);
    } else {
      L.moe.synthesize_mlp(H, s.intermediate_size, false, next_seed, kScale, stream);  // a dense layer
    }
    weight_bytes += L.attn.weight_bytes() + L.mla.weight_bytes() + L.gdn.weight_bytes() + L.post_norm.bytes() +
                    L.moe.bytes();
  }
  host.layers.clear();
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  activations();
  alloc_kv();
}

void Engine::Impl::alloc_kv() {
  for (DevLayer& L : layers)  // the Gated DeltaNet states first: the KV blocks may take what memory is left
    if (L.is_gdn) {
      L.gdn.alloc_state(gdn_dims, max_seqs);
      kv_bytes += L.gdn.state_bytes();
    }
  const int64_t full = max_seqs * ops::kv_blocks_per_slot(max_len);
  // Values per token per layer: K and V of every kv head, or (MLA) one latent row for all heads.
  const size_t token_values = is_mla ? static_cast<size_t>(mla_dims.latent_row()) : 2 * static_cast<size_t>(nkv) * hd;
  int64_t kv_layers = 0;  // a hybrid's Gated DeltaNet layers keep a fixed per-slot state instead
  for (const DevLayer& L : layers) kv_layers += L.is_gdn ? 0 : 1;
  const size_t block_bytes =
      static_cast<size_t>(kKvBlockTokens) * token_values * sizeof(uint16_t) * std::max<int64_t>(kv_layers, 1);
  int64_t blocks = kv_tokens_opt > 0 ? kv_blocks_for(kv_tokens_opt) : full;
  if (kv_tokens_opt == kKvTokensFitMemory) {
    size_t free_b = 0, total_b = 0;
    MOESQ_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t usable = free_b > kKvReserveBytes ? free_b - kKvReserveBytes : 0;
    blocks = std::min<int64_t>(full, static_cast<int64_t>(usable / block_bytes));
    MOESQ_CHECK(blocks >= ops::kv_blocks_per_slot(max_len), "engine: the device memory left after the weights and ",
                "activations (", free_b >> 20, " MiB free, ", kKvReserveBytes >> 20, " MiB kept in reserve) holds ",
                blocks * kKvBlockTokens, " tokens of KV cache, less than one sequence of max_len ", max_len,
                ": lower --max-model-len or --max-num-batched-tokens");
  }
  kv = std::make_unique<KvBlockPool>(max_seqs, max_len, blocks);  // checks blocks ≥ one sequence
  block_table.alloc(kv->table().size());
  for (DevLayer& L : layers) {
    if (is_mla) {
      L.mla.alloc_kv(static_cast<size_t>(blocks) * kKvBlockTokens * mla_dims.latent_row());
      kv_bytes += L.mla.kv_bytes();
    } else if (L.is_gdn) {
      continue;  // its state was allocated first
    } else {
      L.attn.alloc_kv(static_cast<size_t>(blocks) * kKvBlockTokens * nkv * hd);
      kv_bytes += L.attn.kv_bytes();
    }
  }
  table_version = ~uint64_t(0);
  grow_kv({});
}

void Engine::Impl::grow_kv(const std::vector<std::pair<int, int64_t>>& want) {
  kv->grow(want);
  if (kv->version() == table_version) return;
  MOESQ_CUDA_CHECK(cudaMemcpyAsync(block_table.p, kv->table().data(), kv->table().size() * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream));
  table_version = kv->version();
}

MlaCall Engine::Impl::make_mla_call(int64_t T) {
  const MlaBlockDims& d = mla_dims;
  const int nh_i = static_cast<int>(d.nh);
  const int64_t D = d.latent_row(), nq = d.nh * d.d_qk(), nv = d.nh * d.v;
  ops::MlaCacheArgs kvc;
  kvc.block_table = block_table.p, kvc.kv_blocks = kv->num_blocks(), kvc.max_len = max_len;
  MlaCall c;
  c.norm.x = h.p, c.norm.y = xb.p, c.norm.y_lo = xb_lo.p, c.norm.n = T, c.norm.D = H, c.norm.eps = s.rms_norm_eps;
  c.a.x = xb.p, c.a.x_lo = xb_lo.p, c.a.y_f32 = mla_a.p, c.a.split_ws = gemm_split.p;
  c.a.M = T, c.a.N = d.a_cols(), c.a.K = H, c.a.ldy = d.a_cols();
  ops::MlaPrepArgs& p = c.prep;
  p.a = mla_a.p, p.lda = d.a_cols(), p.q_cols = d.q_cols, p.r_q = static_cast<int>(d.r_q);
  p.qa_out = mla_qa.p, p.qa_out_lo = mla_qa_lo.p, p.r_kv = static_cast<int>(d.r_kv), p.rope = static_cast<int>(d.rope);
  p.rope_interleave = d.rope_interleave, p.cos = mla_cos.p, p.sin = mla_sin.p;
  p.tok_slot = tok_slot.p, p.tok_pos = tok_pos.p, p.kv = kvc, p.T = T, p.eps = model::kMlaLatentNormEps;
  c.q_b.x = mla_qa.p, c.q_b.x_lo = mla_qa_lo.p, c.q_b.y_f32 = mla_q.p, c.q_b.split_ws = gemm_split.p;
  c.q_b.M = T, c.q_b.N = nq, c.q_b.K = d.r_q, c.q_b.ldy = nq;
  ops::MlaQArgs& q = c.q;
  q.q = d.r_q > 0 ? mla_q.p : mla_a.p, q.ldq = d.r_q > 0 ? nq : d.a_cols();
  q.q_nope = mla_q_nope.p, q.q_nope_lo = mla_q_nope_lo.p, q.q_att = mla_q_att.p;
  q.nh = nh_i, q.nope = static_cast<int>(d.nope), q.rope = static_cast<int>(d.rope), q.r_kv = static_cast<int>(d.r_kv);
  q.rope_interleave = d.rope_interleave, q.cos = mla_cos.p, q.sin = mla_sin.p, q.tok_pos = tok_pos.p;
  q.max_len = max_len, q.T = T;
  c.uk.x = mla_q_nope.p, c.uk.x_lo = mla_q_nope_lo.p, c.uk.y_f32 = mla_q_att.p, c.uk.groups = nh_i;
  c.uk.M = T, c.uk.N = d.r_kv, c.uk.K = d.nope, c.uk.ldy = D;
  ops::MlaAttentionArgs& at = c.attn;
  at.q = mla_q_att.p, at.kv = kvc, at.tok_slot = tok_slot.p, at.tok_pos = tok_pos.p;
  at.out = mla_o_lat.p, at.out_lo = mla_o_lat_lo.p, at.nh = nh_i, at.r_kv = static_cast<int>(d.r_kv);
  at.rope = static_cast<int>(d.rope), at.scale = d.scale, at.T = T;
  if (T <= mla_split_T) at.partial = mla_partial.p, at.partial_ranges = ops::mla_attention_ranges(max_len);
  c.uv.x = mla_o_lat.p, c.uv.x_lo = mla_o_lat_lo.p, c.uv.y_f32 = mla_o_heads.p, c.uv.groups = nh_i;
  c.uv.M = T, c.uv.N = d.v, c.uv.K = d.r_kv, c.uv.ldy = d.v;
  c.rows.x = mla_o_heads.p, c.rows.y = attn.p, c.rows.y_lo = attn_lo.p, c.rows.nh = nh_i;
  c.rows.v = static_cast<int>(d.v), c.rows.T = T;
  c.o_proj.x = attn.p, c.o_proj.x_lo = attn_lo.p, c.o_proj.y_f32 = h.p, c.o_proj.split_ws = gemm_split.p;
  c.o_proj.accumulate = true, c.o_proj.M = T, c.o_proj.N = H, c.o_proj.K = nv, c.o_proj.ldy = H;
  return c;
}

GdnCall Engine::Impl::make_gdn_call(int64_t T) {
  const GdnBlockDims& d = gdn_dims;
  const int64_t P = d.proj_cols(), C = d.conv_dim(), Vd = d.value_dim();
  const ops::GdnRuns runs{gdn_run_start.p, gdn_run_slot.p, gdn_runs, max_seqs};
  GdnCall c;
  c.norm.x = h.p, c.norm.y = xb.p, c.norm.y_lo = xb_lo.p, c.norm.n = T, c.norm.D = H, c.norm.eps = s.rms_norm_eps;
  c.proj.x = xb.p, c.proj.x_lo = xb_lo.p, c.proj.y_f32 = gdn_proj.p, c.proj.split_ws = gemm_split.p;
  c.proj.M = T, c.proj.N = P, c.proj.K = H, c.proj.ldy = P;
  c.conv.x = gdn_proj.p, c.conv.ldx = P, c.conv.out = gdn_qkv.p, c.conv.runs = runs;
  c.conv.C = static_cast<int>(C), c.conv.Kc = static_cast<int>(d.Kc), c.conv.tokens = T;
  ops::GdnRecurrenceArgs& r = c.rec;
  // A prefill (runs of many tokens) takes the ops' parallel form, bitwise the decode walk's: it may
  // write over gdn_qkv and the b | a columns of gdn_proj, which nothing reads after the recurrence.
  r.tokens = T, r.consume_inputs = true;
  if (gdn_walk_prefill) c.conv.form = r.form = ops::GdnForm::walk;
  r.qkv = gdn_qkv.p, r.z = gdn_proj.p + C, r.b = gdn_proj.p + C + Vd, r.a = gdn_proj.p + C + Vd + d.nv, r.ldz = P;
  r.out_hi = gdn_o.p, r.out_lo = gdn_o_lo.p, r.runs = runs;
  r.nk = static_cast<int>(d.nk), r.dk = static_cast<int>(d.dk), r.nv = static_cast<int>(d.nv);
  r.dv = static_cast<int>(d.dv), r.eps = d.eps;
  c.out_proj.x = gdn_o.p, c.out_proj.x_lo = gdn_o_lo.p, c.out_proj.y_f32 = h.p, c.out_proj.split_ws = gemm_split.p;
  c.out_proj.accumulate = true, c.out_proj.M = T, c.out_proj.N = H, c.out_proj.K = Vd, c.out_proj.ldy = H;
  return c;
}

void Engine::Impl::set_gdn_runs(const std::vector<int32_t>& slot) {
  if (!is_hybrid) return;
  std::vector<int32_t> start = {0}, run_slot;
  std::vector<char> seen(max_seqs, 0);
  for (size_t t = 0; t < slot.size(); ++t) {
    if (t > 0 && slot[t] == slot[t - 1]) continue;
    MOESQ_CHECK(!seen[slot[t]], "engine: slot ", slot[t], " has two runs of tokens in one forward (the Gated "
                "DeltaNet layers continue a slot once per call): give its tokens as one chunk");
    seen[slot[t]] = 1;
    if (t > 0) start.push_back(static_cast<int32_t>(t));
    run_slot.push_back(slot[t]);
  }
  start.push_back(static_cast<int32_t>(slot.size()));
  if (slot.empty()) start = {0};
  MOESQ_CUDA_CHECK(cudaMemcpyAsync(gdn_run_start.p, start.data(), start.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                   stream));
  if (!run_slot.empty())
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(gdn_run_slot.p, run_slot.data(), run_slot.size() * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, stream));
  gdn_runs = static_cast<int>(run_slot.size());
}

void Engine::Impl::linear(const ops::GemmBf16Args& g) {
  if (deterministic || g.groups != 1 || !g.y_f32 || g.counts || g.fused_topk) {  // fused_topk: our kernel runs it
    ops::gemm_bf16(g, stream);
    return;
  }
  ops::gemm_bf16_check(g);
  if (g.M == 0) return;
  if (!cublas) {
    MOESQ_CHECK(cublasCreate(&cublas) == CUBLAS_STATUS_SUCCESS, "engine: cublasCreate failed");
    cublas_ws.alloc(size_t(32) << 20);
    MOESQ_CHECK(cublasSetWorkspace(cublas, cublas_ws.p, cublas_ws.bytes()) == CUBLAS_STATUS_SUCCESS,
                "engine: cublasSetWorkspace failed");
  }
  MOESQ_CHECK(cublasSetStream(cublas, stream) == CUBLAS_STATUS_SUCCESS, "engine: cublasSetStream failed");
  // Column-major view: y^T [N, M] (ld ldy) = W [N, K] (row-major = col-major K×N, transposed) · x^T.
  const float one = 1.0f, zero = 0.0f;
  const int N = static_cast<int>(g.N), M = static_cast<int>(g.M), K = static_cast<int>(g.K), ldy = static_cast<int>(g.ldy);
  auto gemm = [&](const uint16_t* x, const float* beta) {
    const cublasStatus_t st = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, g.w, CUDA_R_16BF, K, x,
                                           CUDA_R_16BF, K, beta, g.y_f32, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT);
    MOESQ_CHECK(st == CUBLAS_STATUS_SUCCESS, "engine: cublasGemmEx failed (", static_cast<int>(st), ") M=", M, " N=", N,
                " K=", K);
  };
  gemm(g.x, g.accumulate ? &one : &zero);
  if (g.x_lo) gemm(g.x_lo, &one);  // hi + lo input as in gemm_bf16 (same precision, other order)
}

void Engine::Impl::set_check_finite(bool on) {
  if (on && !finite_record.p) {
    MOESQ_CHECK(s.num_layers <= kFiniteMaxLayers, "--check-finite: ", s.num_layers, " layers, more than the ",
                kFiniteMaxLayers, " the check numbers");
    MOESQ_CHECK(E <= ops::kFiniteMaxGroups, "--check-finite: ", E, " experts, more than the ", ops::kFiniteMaxGroups,
                " the check numbers");
    finite_record.alloc(1);
    MOESQ_CUDA_CHECK(cudaMemsetAsync(finite_record.p, 0xff, sizeof(uint64_t), stream));  // kFiniteRecordNone
  }
  check_finite = on;
}

void Engine::Impl::check_rows(FiniteStage stage, int64_t l, const float* x, int64_t rows, int64_t cols, int64_t row0) {
  ops::FiniteCheckArgs a;
  a.x_f32 = x, a.rows = rows, a.cols = cols, a.ld = cols, a.row0 = row0;
  a.site = finite_site(l, stage), a.record = finite_record.p;
  ops::finite_check(a, stream);
}

// The routed rows of every expert ([E, capacity T, cols], counts rows each), named by token.
void Engine::Impl::check_experts(FiniteStage stage, int64_t l, const float* x_f32, const uint16_t* x_bf16, int64_t T,
                                 int64_t cols, int64_t row0) {
  // This rank's experts only (the whole layer on one GPU): an expert-parallel shard's buffers hold
  // other experts' gate|up rows it never computed.
  const int64_t e0 = moe_dims.expert_begin, slots0 = e0 * T;
  ops::FiniteCheckArgs a;
  a.x_f32 = x_f32 ? x_f32 + slots0 * cols : nullptr, a.x_bf16 = x_bf16 ? x_bf16 + slots0 * cols : nullptr;
  a.cols = cols, a.ld = cols;
  a.groups = moe_dims.shard_size(), a.capacity = T, a.counts = moe_bufs.counts + e0;
  a.row_ids = moe_bufs.route_of_slot + slots0, a.group0 = e0;
  a.row_div = static_cast<int>(moe_dims.top_k), a.row0 = row0;
  a.site = finite_site(l, stage), a.record = finite_record.p;
  ops::finite_check(a, stream);
}

// After moe_block on the slice [t0, t0 + T): its buffers still hold the slice's router logits and
// expert outputs.
void Engine::Impl::check_moe_layer(int64_t l, int64_t t0, int64_t T) {
  float* hs = h.p + t0 * H;
  if (!layers[l].moe.experts) {  // a dense MLP layer
    check_rows(FiniteStage::kMoeOutput, l, hs, T, H, t0);
    return;
  }
  check_rows(FiniteStage::kRouterLogits, l, moe_bufs.router_logits, T, E, t0);
  check_experts(FiniteStage::kExpertGateUp, l, moe_bufs.hbuf, nullptr, T, 2 * moe_dims.I, t0);
  check_experts(FiniteStage::kExpertOutput, l, nullptr, moe_bufs.ybuf, T, H, t0);
  check_rows(FiniteStage::kMoeOutput, l, hs, T, H, t0);
}

void Engine::Impl::read_finite_record(uint64_t* host) {
  MOESQ_CUDA_CHECK(cudaMemcpyAsync(host, finite_record.p, sizeof(uint64_t), cudaMemcpyDeviceToHost, stream));
}

// After the forward's sync, a finding: NonFiniteError, the record emptied for the next forward.
void Engine::Impl::throw_non_finite(uint64_t key, const FiniteRows& rows) {
  MOESQ_CUDA_CHECK(cudaMemsetAsync(finite_record.p, 0xff, sizeof(uint64_t), stream));  // before any later forward
  throw NonFiniteError(ops::decode_finite_key(key), s.num_layers, rows);
}

void Engine::Impl::run(int64_t T, int64_t n_out, int64_t n_tiles, bool identity_rows) {
  const PdlTokensScope pdl(T);  // PDL for decode-sized steps only (core/cuda/pdl.cuh)
  ops::EmbedArgs em;
  em.ids = tok_ids.p, em.table = embed.p, em.out = h.p, em.T = T, em.H = H;
  ops::embed(em, stream);
  if (check_finite) check_rows(FiniteStage::kEmbedding, -1, h.p, T, H);
  const LinearFn lin = [this](const ops::GemmBf16Args& g) { linear(g); };
  AttentionCall call;
  ops::RmsNormArgs& rn = call.norm;
  rn.x = h.p, rn.y = xb.p, rn.y_lo = xb_lo.p, rn.n = T, rn.D = H, rn.eps = s.rms_norm_eps;
  ops::GemmBf16Args& gq = call.qkv;
  gq.x = xb.p, gq.x_lo = xb_lo.p, gq.y_f32 = qkv.p, gq.split_ws = gemm_split.p;
  gq.M = T, gq.N = qkv_w, gq.K = H, gq.ldy = qkv_w;
  ops::QkRopeArgs& qr = call.rope;
  qr.qkv = qkv.p, qr.cos = rope_cos.p, qr.sin = rope_sin.p;
  qr.tok_slot = tok_slot.p, qr.tok_pos = tok_pos.p, qr.q_out = q.p;
  qr.T = T, qr.nh = static_cast<int>(nh), qr.nkv = static_cast<int>(nkv);
  qr.hd = static_cast<int>(hd), qr.max_len = max_len, qr.eps = s.rms_norm_eps;
  qr.whole_qk_norm = s.qk_norm == io::QkNorm::Whole;
  qr.block_table = block_table.p, qr.kv_blocks = kv->num_blocks();
  qr.rot = rot == hd ? 0 : rot, qr.q_gate = is_hybrid;
  ops::AttentionArgs& at = call.attn;
  at.q = q.p, at.tok_slot = tok_slot.p, at.tok_pos = tok_pos.p;
  at.out = attn.p, at.out_lo = attn_lo.p, at.T = T;
  at.nh = static_cast<int>(nh), at.nkv = static_cast<int>(nkv), at.hd = static_cast<int>(hd);
  at.max_len = max_len, at.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  at.block_table = block_table.p, at.kv_blocks = kv->num_blocks();
  if (n_tiles > 0)
    at.tiles = attn_tiles.p, at.n_tiles = n_tiles;
  else
    at.partial = attn_partial.p;
  if (is_hybrid) at.gate = qkv.p + hd, at.gate_ld = qkv_w, at.gate_head_ld = static_cast<int>(2 * hd);
  ops::GemmBf16Args& go = call.o_proj;
  go.x = attn.p, go.x_lo = attn_lo.p, go.y_f32 = h.p, go.split_ws = gemm_split.p, go.accumulate = true;
  go.M = T, go.N = H, go.K = nh * hd, go.ldy = H;
  MlaCall mla_call;
  if (is_mla) mla_call = make_mla_call(T);
  GdnCall gdn_call;
  if (is_hybrid) gdn_call = make_gdn_call(T);
  bool normed = false;  // xb, xb_lo already hold layer l's normalized input (the last combine ran the norm)
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const DevLayer& L = layers[l];
    AttentionMarks marks;
    if (timing) marks.after_qkv = events[4 * l], marks.after_attention = events[4 * l + 1];
    if (is_mla) {
      mla_block(L.mla, mla_call, lin, stream, marks);
    } else if (L.is_gdn) {
      gdn_block(L.gdn, gdn_call, lin, stream, gdn_update, marks);
    } else {
      call.norm_done = normed;
      attention_block(L.attn, call, lin, stream, marks);
    }
    if (check_finite) check_rows(FiniteStage::kAttention, l, h.p, T, H);
    ops::RmsNormArgs pn = rn;
    pn.w = L.post_norm.p;
    ops::rmsnorm(pn, stream);
    if (timing) MOESQ_CUDA_CHECK(cudaEventRecord(events[4 * l + 2], stream));
    // The norm after the MoE block — the next attention layer's input norm, or the final norm — runs in
    // the combine kernel where it can (moe_block's next_norm; the MLA and Gated DeltaNet blocks run their own).
    const bool last = l + 1 == s.num_layers;
    const bool next_attn = !last && !is_mla && !layers[l + 1].is_gdn;
    normed = last || next_attn;
    for (int64_t t0 = 0; t0 < T; t0 += moe_T) {  // slices of moe_T rows: the same bits as one call
      const int64_t n = std::min(moe_T, T - t0);
      ops::RmsNormArgs nn = rn;
      nn.w = last ? final_norm.p : layers[l + 1].attn.input_norm.p;
      nn.x = h.p + t0 * H, nn.y = xb.p + t0 * H, nn.y_lo = xb_lo.p + t0 * H, nn.n = n;
      const bool ran = moe_block(moe_dims, L.moe, moe_bufs, xb.p + t0 * H, xb_lo.p + t0 * H, h.p + t0 * H, n,
                                 stream, lin, kMoeAllStages, &exchange, normed ? &nn : nullptr);
      normed = normed && ran;  // every slice's combine ran it (they agree: the same layer)
      if (check_finite) check_moe_layer(l, t0, n);
    }
    if (timing) MOESQ_CUDA_CHECK(cudaEventRecord(events[4 * l + 3], stream));
  }
  if (!normed) {
    ops::RmsNormArgs fn = rn;
    fn.w = final_norm.p;
    ops::rmsnorm(fn, stream);
  }
  // The rows whose logits are wanted: gathered, unless they are all T rows in order (every decode
  // step): then the lm_head reads xb itself, two copy kernels fewer, the same values.
  const uint16_t* sel = xb.p;
  const uint16_t* sel_lo = xb_lo.p;
  if (!identity_rows) {
    ops::GatherRowsArgs gr;
    gr.in = xb.p, gr.rows = out_rows.p, gr.out = xsel.p, gr.n = n_out, gr.H = H;
    ops::gather_rows(gr, stream);
    gr.in = xb_lo.p, gr.out = xsel_lo.p;
    ops::gather_rows(gr, stream);
    sel = xsel.p, sel_lo = xsel_lo.p;
  }
  ops::GemmBf16Args g;
  g.x = sel, g.x_lo = sel_lo, g.w = lm_head.p, g.y_f32 = logits.p, g.M = n_out, g.N = V, g.K = H, g.ldy = V;
  linear(g);
  if (check_finite) check_rows(FiniteStage::kLogits, s.num_layers, logits.p, n_out, V);
  ops::ArgmaxArgs am;
  am.logits = logits.p, am.out = next_ids.p, am.n = n_out, am.V = V;
  ops::argmax(am, stream);
}

namespace {
constexpr const char* kEngineWhat = "the GPU engine (--device cuda)";
}  // namespace

Engine::Engine(const io::Checkpoint& ckpt, const EngineOptions& opt)
    : Engine((require_cuda_device(kEngineWhat), load_host_model(ckpt, opt.experts, opt.expert_begin, opt.expert_end)),
             opt) {}

Engine::Engine(HostModel host, const EngineOptions& opt) : impl_(std::make_unique<Impl>()) {
  require_cuda_device(kEngineWhat);
  impl_->upload(std::move(host), opt);
}

Engine::Engine(const io::ModelSpec& spec, ExpertBackend backend, uint64_t seed, const EngineOptions& opt)
    : Engine(
          [&] {
            HostModel shapes;
            shapes.spec = spec;
            return shapes;
          }(),
          backend, seed, opt) {}

Engine::Engine(const HostModel& shapes, ExpertBackend backend, uint64_t seed, const EngineOptions& opt)
    : impl_(std::make_unique<Impl>()) {
  require_cuda_device(kEngineWhat);
  MOESQ_CHECK(backend != ExpertBackend::kAuto && expert_backend_built(backend), "synthetic engine: expert backend ",
              expert_backend_name(backend), " is not built; built: ", built_expert_backends());
  Impl& m = *impl_;
  const io::ModelSpec& spec = shapes.spec;
  m.s = spec;
  m.host.spec = spec;
  m.host.rope = shapes.rope;  // the hybrid's partial RoPE, its Gated DeltaNet dims and layer kinds
  m.host.gdn = shapes.gdn;
  m.host.layers.resize(shapes.layers.size());
  for (size_t l = 0; l < shapes.layers.size(); ++l) m.host.layers[l].is_gdn = shapes.layers[l].is_gdn;
  m.host.backend = backend;
  m.host.expert_storage = expert_backend_host(backend).native_storage();
  m.host.act_quant = expert_backend_host(backend).act_quant();
  m.host.act_block = expert_backend_host(backend).act_block();
  m.sizes(opt);
  m.synthesize(seed);
}

Engine::~Engine() = default;

const io::ModelSpec& Engine::spec() const { return impl_->s; }
ExpertBackend Engine::backend() const { return impl_->host.backend; }
io::ExpertStorage Engine::expert_storage() const { return impl_->host.expert_storage; }
const char* Engine::expert_format() const { return io::expert_storage_name(impl_->host.expert_storage); }
bool Engine::act_quant() const { return impl_->host.act_quant; }
int Engine::act_block() const { return impl_->host.act_block; }
int Engine::max_seqs() const { return impl_->max_seqs; }
int64_t Engine::max_len() const { return impl_->max_len; }
int64_t Engine::max_tokens() const { return impl_->max_tokens; }
size_t Engine::weight_bytes() const { return impl_->weight_bytes; }
size_t Engine::kv_bytes() const { return impl_->kv_bytes; }
int64_t Engine::kv_blocks() const { return impl_->kv->num_blocks(); }
int64_t Engine::kv_free_blocks() const { return impl_->kv->free_blocks(); }
void Engine::set_timing(bool on) { impl_->timing = on; }
double Engine::last_attention_ms() const { return impl_->attn_ms; }
double Engine::last_moe_ms() const { return impl_->moe_ms; }
void Engine::set_deterministic(bool on) {
  Impl& m = *impl_;
  if (m.deterministic == on) return;
  MOESQ_CHECK(on || !m.moe_dims.sharded(), "engine: expert-parallel ranks need deterministic mode (cuBLAS may "
              "round a row differently on another rank, and the ranks would route apart)");
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  for (auto& [b, g] : m.graphs) cudaGraphExecDestroy(g);
  m.graphs.clear();
  m.deterministic = on;
}
bool Engine::deterministic() const { return impl_->deterministic; }
void Engine::set_check_finite(bool on) {
  Impl& m = *impl_;
  if (m.check_finite == on) return;
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  for (auto& [b, g] : m.graphs) cudaGraphExecDestroy(g);
  m.graphs.clear();
  m.set_check_finite(on);
}
bool Engine::check_finite() const { return impl_->check_finite; }
void Engine::reset() {
  std::fill(impl_->lengths.begin(), impl_->lengths.end(), 0);
  impl_->kv->release_all();
  for (DevLayer& L : impl_->layers)
    if (L.is_gdn) L.gdn.reset(-1, impl_->stream);
}
void Engine::reset(int slot) {
  MOESQ_CHECK(slot >= 0 && slot < impl_->max_seqs, "engine: slot ", slot, " outside [0, ", impl_->max_seqs, ")");
  impl_->lengths[slot] = 0;
  impl_->kv->release(slot);
  for (DevLayer& L : impl_->layers)  // stream-ordered before the slot's next forward
    if (L.is_gdn) L.gdn.reset(slot, impl_->stream);
}
int64_t Engine::length(int slot) const { return impl_->lengths.at(slot); }

std::vector<float> Engine::forward(const std::vector<SeqChunk>& chunks, bool all_logits) {
  Impl& m = *impl_;
  std::vector<int32_t> ids, slot, pos, rows;
  std::vector<int64_t> len = m.lengths;
  for (const SeqChunk& c : chunks) {
    MOESQ_CHECK(c.slot >= 0 && c.slot < m.max_seqs, "engine: slot ", c.slot, " outside [0, ", m.max_seqs, ")");
    MOESQ_CHECK(!c.tokens.empty(), "engine: empty chunk for slot ", c.slot);
    MOESQ_CHECK(len[c.slot] + static_cast<int64_t>(c.tokens.size()) <= m.max_len, "engine: slot ", c.slot, " would hold ",
                len[c.slot] + c.tokens.size(), " tokens, more than max_len ", m.max_len);
    for (int32_t t : c.tokens) {
      MOESQ_CHECK(t >= 0 && t < m.V, "engine: token id ", t, " outside the vocabulary [0, ", m.V, ")");
      if (all_logits) rows.push_back(static_cast<int32_t>(ids.size()));
      ids.push_back(t);
      slot.push_back(c.slot);
      pos.push_back(static_cast<int32_t>(len[c.slot]++));
    }
    if (!all_logits) rows.push_back(static_cast<int32_t>(ids.size() - 1));
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  MOESQ_CHECK(T <= m.max_tokens, "engine: ", T, " tokens in one forward, more than max_tokens ", m.max_tokens);
  if (T == 0) return {};
  std::vector<std::pair<int, int64_t>> want;
  for (const SeqChunk& c : chunks) want.emplace_back(c.slot, len[c.slot]);
  m.set_gdn_runs(slot);  // refuses a slot in two runs before anything changes
  m.grow_kv(want);  // KvCacheFull: nothing ran, nothing changed
  auto h2d = [&](DevBuf<int32_t>& d, const std::vector<int32_t>& v) {
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(d.p, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
  };
  h2d(m.tok_ids, ids), h2d(m.tok_slot, slot), h2d(m.tok_pos, pos), h2d(m.out_rows, rows);
  const std::vector<int32_t> tiles =  // the GQA prefill's tiles (the MLA block walks each token's keys itself)
      m.is_mla ? std::vector<int32_t>{0, 1}
               : ops::attention_tiles(slot.data(), pos.data(), T, static_cast<int>(m.nh), static_cast<int>(m.nkv));
  h2d(m.attn_tiles, tiles);
  bool identity = static_cast<int64_t>(rows.size()) == T;
  for (size_t i = 0; identity && i < rows.size(); ++i) identity = rows[i] == static_cast<int32_t>(i);
  m.run(T, static_cast<int64_t>(rows.size()), static_cast<int64_t>(tiles.size() / 2), identity);
  std::vector<float> out(rows.size() * m.V);
  MOESQ_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.logits.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
  uint64_t finite_rec = ops::kFiniteRecordNone;  // stays none when the check is off
  if (m.check_finite) m.read_finite_record(&finite_rec);
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  if (finite_rec != ops::kFiniteRecordNone) m.throw_non_finite(finite_rec, FiniteRows{slot, pos, rows});
  if (m.timing) {
    m.attn_ms = m.moe_ms = 0;
    for (int64_t l = 0; l < m.s.num_layers; ++l) {
      float a = 0, b = 0;
      MOESQ_CUDA_CHECK(cudaEventElapsedTime(&a, m.events[4 * l], m.events[4 * l + 1]));
      MOESQ_CUDA_CHECK(cudaEventElapsedTime(&b, m.events[4 * l + 2], m.events[4 * l + 3]));
      m.attn_ms += a, m.moe_ms += b;
    }
  }
  m.lengths = len;
  return out;
}

namespace {
std::vector<int32_t> first_slots(size_t B) {
  std::vector<int32_t> slots(B);
  for (size_t b = 0; b < B; ++b) slots[b] = static_cast<int32_t>(b);
  return slots;
}
}  // namespace

std::vector<float> Engine::decode(const std::vector<int32_t>& tokens) { return decode(first_slots(tokens.size()), tokens); }

std::vector<int32_t> Engine::decode_greedy(const std::vector<int32_t>& tokens) {
  return decode_greedy(first_slots(tokens.size()), tokens);
}

std::vector<float> Engine::decode(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens) {
  std::vector<float> out;
  decode_step(slots, tokens, &out, nullptr);
  return out;
}

std::vector<int32_t> Engine::decode_greedy(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> next;
  decode_step(slots, tokens, nullptr, &next);
  return next;
}

// The host writes this step's tokens, slots and positions into the device arrays the captured graph
// reads (tok_ids, tok_slot, tok_pos; out_rows = 0..B−1), so the graph of batch size B serves any B slots.
void Engine::decode_step(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens,
                         std::vector<float>* logits, std::vector<int32_t>* next) {
  Impl& m = *impl_;
  const int B = static_cast<int>(tokens.size());
  MOESQ_CHECK(B >= 1 && B <= m.max_seqs && B <= m.max_tokens, "engine: decode batch ", B, " outside [1, ",
              std::min<int64_t>(m.max_seqs, m.max_tokens), "]");
  MOESQ_CHECK(slots.size() == tokens.size(), "engine: decode got ", slots.size(), " slots for ", tokens.size(),
              " tokens");
  std::vector<int32_t> pos(B), rows(B);
  std::vector<char> seen(m.max_seqs, 0);
  for (int b = 0; b < B; ++b) {
    const int32_t s = slots[b];
    MOESQ_CHECK(s >= 0 && s < m.max_seqs, "engine: slot ", s, " outside [0, ", m.max_seqs, ")");
    MOESQ_CHECK(!seen[s], "engine: slot ", s, " given twice in one decode step");
    seen[s] = 1;
    MOESQ_CHECK(tokens[b] >= 0 && tokens[b] < m.V, "engine: token id ", tokens[b], " outside the vocabulary");
    MOESQ_CHECK(m.lengths[s] < m.max_len, "engine: slot ", s, " is full (max_len ", m.max_len, ")");
    pos[b] = static_cast<int32_t>(m.lengths[s]), rows[b] = b;
  }
  std::vector<std::pair<int, int64_t>> want;
  for (int b = 0; b < B; ++b) want.emplace_back(slots[b], m.lengths[slots[b]] + 1);
  m.grow_kv(want);  // KvCacheFull: nothing ran, nothing changed
  auto h2d = [&](DevBuf<int32_t>& d, const std::vector<int32_t>& v) {
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(d.p, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
  };
  h2d(m.tok_ids, tokens), h2d(m.tok_slot, slots), h2d(m.tok_pos, pos), h2d(m.out_rows, rows);
  m.set_gdn_runs(slots);  // distinct slots: B runs of one token, device arrays the graph reads
  // Experts sharded over ranks with an exchange through the host: the step runs eagerly (the same
  // launches as the graph's, so the same bits).
  const bool eager = m.moe_dims.sharded() && !m.exchange.capturable;
  auto it = m.graphs.find(B);
  if (eager) {
    m.run(B, B, 0, true);
  } else if (it == m.graphs.end()) {
    // Eager once first (first-use work: attributes, cached device properties), then capture. The
    // eager step's KV writes are redone identically by the replay below (same positions).
    const bool timing = m.timing;
    m.timing = false;
    struct StateFrozen {  // the Gated DeltaNet states are not moved on twice for one step
      bool& update;
      explicit StateFrozen(bool& u) : update(u) { update = false; }
      ~StateFrozen() { update = true; }
    };
    {
      const StateFrozen frozen(m.gdn_update);
      m.run(B, B, 0, true);
    }
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    cudaGraph_t graph;
    MOESQ_CUDA_CHECK(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal));
    m.run(B, B, 0, true);
    MOESQ_CUDA_CHECK(cudaStreamEndCapture(m.stream, &graph));
    cudaGraphExec_t exec;
    MOESQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    it = m.graphs.emplace(B, exec).first;
    m.timing = timing;
  }
  if (!eager) MOESQ_CUDA_CHECK(cudaGraphLaunch(it->second, m.stream));
  if (logits) {
    logits->resize(static_cast<size_t>(B) * m.V);
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(logits->data(), m.logits.p, logits->size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     m.stream));
  }
  if (next) {
    next->resize(B);
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(next->data(), m.next_ids.p, B * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream));
  }
  uint64_t finite_rec = ops::kFiniteRecordNone;  // stays none when the check is off
  if (m.check_finite) m.read_finite_record(&finite_rec);
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  if (finite_rec != ops::kFiniteRecordNone) m.throw_non_finite(finite_rec, FiniteRows{slots, pos, rows});
  for (int b = 0; b < B; ++b) ++m.lengths[slots[b]];
}

}  // namespace moesq::runtime

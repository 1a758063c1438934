// The GPU engine (engine.h). One stream; activation buffers sized once for max_tokens; a forward of T
// tokens uses expert capacity T (an expert receives at most one route per token), so no route is ever
// dropped and the host never reads the device-side counts. The non-expert GEMMs take their bf16
// inputs as hi + lo pairs (ops::gemm_bf16 x_lo): near-fp32 inputs at the cost of a second MMA.
#include "runtime/engine.h"
#include "runtime/moe_block.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/cuda/check.cuh"
#include "model/ops.h"
#include "ops/attention/attention.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/qk_rope/qk_rope.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/synth_pack/synth_pack.h"

namespace moesq::runtime {

namespace {

// An owning device allocation (cudaMalloc: never managed memory, device/README.md).
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t count) { alloc(count); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  Dev(Dev&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr, o.n = 0; }
  Dev& operator=(Dev&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  void alloc(size_t count) {
    n = count;
    MOESQ_CUDA_CHECK(cudaMalloc(&p, sizeof(T) * std::max<size_t>(count, 1)));
  }
  void upload(const std::vector<T>& h) {
    if (n != h.size()) alloc(h.size());
    if (!h.empty()) MOESQ_CUDA_CHECK(cudaMemcpy(p, h.data(), sizeof(T) * h.size(), cudaMemcpyHostToDevice));
  }
  size_t bytes() const { return sizeof(T) * n; }
};

// Embedding gather: h[t] = fp32(embed[ids[t]]). ids outside [0, V) are refused on the host.
__global__ void embed_kernel(const int32_t* ids, const uint16_t* embed, float* h, int64_t H) {
  const int64_t t = blockIdx.x;
  const uint16_t* row = embed + static_cast<int64_t>(ids[t]) * H;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) h[t * H + c] = __bfloat162float(__ushort_as_bfloat16(row[c]));
}

// out[i] = in[rows[i]] (bf16 rows of width H): the rows whose logits are wanted.
__global__ void gather_rows_kernel(const uint16_t* in, const int32_t* rows, uint16_t* out, int64_t H) {
  const int64_t i = blockIdx.x;
  const uint16_t* src = in + static_cast<int64_t>(rows[i]) * H;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) out[i * H + c] = src[c];
}

// next[i] = argmax_v logits[i, v] (lowest v on ties, as runtime::Sampler's greedy choice).
__global__ void argmax_kernel(const float* logits, int64_t V, int32_t* next) {
  __shared__ float s_v[256];
  __shared__ int32_t s_i[256];
  const float* z = logits + static_cast<int64_t>(blockIdx.x) * V;
  float bv = -INFINITY;
  int32_t bi = 0x7fffffff;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    if (z[v] > bv) bv = z[v], bi = static_cast<int32_t>(v);
  s_v[threadIdx.x] = bv, s_i[threadIdx.x] = bi;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) {
      const float ov = s_v[threadIdx.x + h];
      const int32_t oi = s_i[threadIdx.x + h];
      if (ov > s_v[threadIdx.x] || (ov == s_v[threadIdx.x] && oi < s_i[threadIdx.x])) s_v[threadIdx.x] = ov, s_i[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) next[blockIdx.x] = s_i[0] == 0x7fffffff ? 0 : s_i[0];
}

struct DevLayer {
  Dev<float> input_norm, post_norm, q_norm, k_norm;
  Dev<uint16_t> qkv, o, router;
  Dev<uint16_t> gu_dense, down_dense;   // bf16 backend
  Dev<uint8_t> gu_sparse, down_sparse;  // sparse backends, kernel layout
  Dev<float> gu_inv_gamma, down_inv_gamma;  // [E] 1/γ_w
  int64_t gu_M_pad = 0, down_M_pad = 0;
  Dev<uint16_t> k_cache, v_cache;       // [slots, max_len, nkv, hd]
};

}  // namespace

struct Engine::Impl {
  HostModel host;  // weights are dropped after upload; spec and flags stay
  io::ModelSpec s;
  int max_seqs = 1;
  int64_t max_len = 0, max_tokens = 0;
  int64_t H = 0, hd = 0, nh = 0, nkv = 0, E = 0, I = 0, V = 0, k = 0, H_pad = 0, I_pad = 0, qkv_w = 0;
  MoeBlockDims moe_dims;
  cudaStream_t stream = nullptr;
  bool deterministic = true;
  cublasHandle_t cublas = nullptr;  // deterministic == false only
  Dev<uint8_t> cublas_ws;           // fixed cuBLAS workspace (graph capture allocates nothing)
  std::vector<DevLayer> layers;
  Dev<uint16_t> embed, lm_head;
  Dev<float> final_norm, rope_cos, rope_sin;
  // activations, [max_tokens, ·] unless noted
  Dev<int32_t> tok_ids, tok_slot, tok_pos, out_rows, next_ids, attn_tiles;
  Dev<float> attn_partial;  // split-KV partials of a decode step (ops::attention)
  Dev<float> gemm_split;    // K-sliced partials of the q|k|v, o_proj and router GEMMs (gemm_bf16 split_ws)
  Dev<float> h, qkv, q, logits_r, topk_w, logits;
  Dev<uint16_t> xb, attn, xsel, xb_lo, attn_lo, xsel_lo;  // *_lo: bf16 residues (hi + lo split inputs)
  Dev<int32_t> topk_ids, slot_of_route;
  Dev<uint16_t> xd, ad, ybuf;           // [E, cap, H_pad], [E, cap, I_pad], [E, cap, H]
  Dev<float> hbuf;                      // [E, cap, 2I] fp32 gate|up: SwiGLU (+ requant) reads fp32
  Dev<float> xs, as;                    // [E, cap]
  Dev<int32_t> counts, route_of_slot;   // [E], [E, cap]
  std::vector<int64_t> lengths;         // [slots]
  size_t weight_bytes = 0, kv_bytes = 0;
  bool timing = false;
  double attn_ms = 0, moe_ms = 0;
  std::vector<cudaEvent_t> events;
  std::map<int, cudaGraphExec_t> graphs;  // decode graph per batch size

  void upload(HostModel&& m, const EngineOptions& opt);
  void sizes(const EngineOptions& opt);
  void activations();
  void synthesize(uint64_t seed);
  // All kernels of one forward on tok_* (device), logits of out_rows. n_tiles > 0: prefill attention
  // over attn_tiles; 0: split-KV attention (decode). Both give a row the same bits (attention.h).
  void run(int64_t T, int64_t n_out, int64_t n_tiles);
  MoeBlockWeights moe_weights(const DevLayer& L) const;
  MoeBlockBuffers moe_buffers();
  void linear(const ops::GemmBf16Args& g);  // gemm_bf16, or cuBLAS when !deterministic
  ~Impl() {
    if (cublas) cublasDestroy(cublas);
    for (auto& [b, g] : graphs) cudaGraphExecDestroy(g);
    for (auto e : events) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  }
};

void Engine::Impl::sizes(const EngineOptions& opt) {
  H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads, E = s.num_experts;
  I = s.moe_intermediate_size, V = s.vocab_size, k = s.top_k;
  H_pad = format::padded_k(H), I_pad = format::padded_k(I), qkv_w = (nh + 2 * nkv) * hd;
  moe_dims = moe_block_dims(s);
  MOESQ_CHECK(opt.max_seqs >= 1, "engine: max_seqs must be >= 1");
  max_seqs = opt.max_seqs;
  max_len = opt.max_len > 0 ? opt.max_len : (s.max_position_embeddings > 0 ? s.max_position_embeddings : 4096);
  max_tokens = opt.max_tokens > 0 ? opt.max_tokens : max_seqs * max_len;
  MOESQ_CHECK(max_tokens <= (int64_t(1) << 20), "engine: max_tokens ", max_tokens, " too large");
  MOESQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  deterministic = opt.deterministic;
  std::vector<float> c, sn;
  model::rope_tables(max_len, hd, s.rope_theta, c, sn);
  rope_cos.upload(c);
  rope_sin.upload(sn);
}

void Engine::Impl::upload(HostModel&& m, const EngineOptions& opt) {
  s = m.spec;
  sizes(opt);
  auto track = [&](auto& d, const auto& v) {
    d.upload(v);
    weight_bytes += d.bytes();
  };
  track(embed, m.embed);
  track(lm_head, m.lm_head);
  track(final_norm, m.final_norm);
  layers.resize(s.num_layers);
  const size_t cache_n = static_cast<size_t>(max_seqs) * max_len * nkv * hd;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    HostLayer& hl = m.layers[l];
    DevLayer& L = layers[l];
    track(L.input_norm, hl.input_norm);
    track(L.post_norm, hl.post_norm);
    track(L.q_norm, hl.q_norm);
    track(L.k_norm, hl.k_norm);
    track(L.qkv, hl.qkv);
    track(L.o, hl.o);
    track(L.router, hl.router);
    if (m.backend == ExpertBackend::kBf16) {
      track(L.gu_dense, hl.gu_dense);
      track(L.down_dense, hl.down_dense);
    } else {
      track(L.gu_sparse, hl.gu_sparse.data);
      track(L.down_sparse, hl.down_sparse.data);
      std::vector<float> ig(E), idn(E);
      for (int64_t e = 0; e < E; ++e) ig[e] = 1.0f / hl.gu_sparse.gamma[e], idn[e] = 1.0f / hl.down_sparse.gamma[e];
      track(L.gu_inv_gamma, ig);
      track(L.down_inv_gamma, idn);
      L.gu_M_pad = hl.gu_sparse.M_pad;
      L.down_M_pad = hl.down_sparse.M_pad;
    }
    hl = HostLayer{};  // free host memory as we go
    L.k_cache.alloc(cache_n);
    L.v_cache.alloc(cache_n);
    kv_bytes += L.k_cache.bytes() + L.v_cache.bytes();
  }
  host = std::move(m);
  host.embed.clear(), host.lm_head.clear(), host.layers.clear();
  activations();
}

void Engine::Impl::activations() {
  const size_t T = max_tokens, cap = max_tokens;
  tok_ids.alloc(T), tok_slot.alloc(T), tok_pos.alloc(T), out_rows.alloc(T), next_ids.alloc(T), attn_tiles.alloc(2 * T);
  attn_partial.alloc(ops::attention_partial_floats(max_seqs, static_cast<int>(nh), static_cast<int>(hd), max_len));
  gemm_split.alloc(std::max({ops::gemm_bf16_split_floats(T, qkv_w, H), ops::gemm_bf16_split_floats(T, H, nh * hd),
                             ops::gemm_bf16_split_floats(T, E, H)}));
  h.alloc(T * H), qkv.alloc(T * qkv_w), q.alloc(T * nh * hd), logits_r.alloc(T * E);
  topk_w.alloc(T * k), topk_ids.alloc(T * k), slot_of_route.alloc(T * k);
  xb.alloc(T * H), attn.alloc(T * nh * hd), xsel.alloc(T * H);
  xb_lo.alloc(T * H), attn_lo.alloc(T * nh * hd), xsel_lo.alloc(T * H);
  xd.alloc(E * cap * H_pad), hbuf.alloc(E * cap * 2 * I), ad.alloc(E * cap * I_pad), ybuf.alloc(E * cap * H);
  xs.alloc(E * cap), as.alloc(E * cap), counts.alloc(E), route_of_slot.alloc(E * cap);
  lengths.assign(max_seqs, 0);
  events.resize(4 * s.num_layers);
  for (auto& e : events) MOESQ_CUDA_CHECK(cudaEventCreate(&e));
  logits.alloc(static_cast<size_t>(max_tokens) * V);
}

void Engine::Impl::synthesize(uint64_t seed) {
  uint64_t stream_id = 0;  // every tensor its own hash stream
  constexpr float kScale = 0.02f;  // weight std: keeps the random residual stream tame
  auto bf16 = [&](Dev<uint16_t>& d, size_t n, float scale) {
    d.alloc(n);
    ops::SynthBf16Args a;
    a.out = d.p, a.n = static_cast<int64_t>(n), a.seed = seed ^ (++stream_id * 0xd1b54a32d192ed03ull), a.scale = scale;
    ops::synth_bf16(a, stream);
    weight_bytes += d.bytes();
  };
  auto ones = [&](Dev<float>& d, size_t n) {
    d.upload(std::vector<float>(n, 1.0f));
    weight_bytes += d.bytes();
  };
  auto sparse = [&](Dev<uint8_t>& d, Dev<float>& inv_gamma, int64_t M, int64_t K_pad, int64_t* M_pad) {
    *M_pad = (M + format::kMmaM - 1) / format::kMmaM * format::kMmaM;
    const int64_t chunks = E * (*M_pad / format::kMmaM) * (K_pad / format::kChunkK);
    d.alloc(static_cast<size_t>(chunks) * format::kChunkBytes);
    ops::SynthSparseArgs a;
    a.out = d.p, a.num_chunks = chunks, a.seed = seed ^ (++stream_id * 0xd1b54a32d192ed03ull);
    ops::synth_sparse48_kl(a, stream);
    // E2M1 codes have rms ≈ 2.9 and the block scales average ≈ 0.72: 1/γ maps that to ≈ kScale.
    inv_gamma.upload(std::vector<float>(E, kScale / (2.9f * 0.72f)));
    weight_bytes += d.bytes() + inv_gamma.bytes();
  };
  bf16(embed, V * H, 1.0f);
  bf16(lm_head, V * H, kScale);
  ones(final_norm, H);
  layers.resize(s.num_layers);
  const size_t cache_n = static_cast<size_t>(max_seqs) * max_len * nkv * hd;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    DevLayer& L = layers[l];
    ones(L.input_norm, H), ones(L.post_norm, H), ones(L.q_norm, hd), ones(L.k_norm, hd);
    bf16(L.qkv, qkv_w * H, kScale);
    bf16(L.o, H * nh * hd, kScale);
    bf16(L.router, E * H, kScale);
    if (host.backend == ExpertBackend::kBf16) {
      bf16(L.gu_dense, E * 2 * I * H_pad, kScale);
      bf16(L.down_dense, E * H * I_pad, kScale);
    } else {
      sparse(L.gu_sparse, L.gu_inv_gamma, 2 * I, H_pad, &L.gu_M_pad);
      sparse(L.down_sparse, L.down_inv_gamma, H, I_pad, &L.down_M_pad);
    }
    L.k_cache.alloc(cache_n);
    L.v_cache.alloc(cache_n);
    kv_bytes += L.k_cache.bytes() + L.v_cache.bytes();
  }
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  activations();
}

MoeBlockWeights Engine::Impl::moe_weights(const DevLayer& L) const {
  MoeBlockWeights w;
  w.backend = host.backend;
  w.router = L.router.p, w.gu_dense = L.gu_dense.p, w.down_dense = L.down_dense.p;
  w.gu_sparse = L.gu_sparse.p, w.down_sparse = L.down_sparse.p;
  w.gu_inv_gamma = L.gu_inv_gamma.p, w.down_inv_gamma = L.down_inv_gamma.p;
  w.gu_M_pad = L.gu_M_pad, w.down_M_pad = L.down_M_pad;
  return w;
}

// The [max_tokens]-sized activation buffers, used by moe_block with capacity T ≤ max_tokens.
MoeBlockBuffers Engine::Impl::moe_buffers() {
  MoeBlockBuffers b;
  b.router_logits = logits_r.p, b.gemm_split = gemm_split.p, b.topk_ids = topk_ids.p, b.topk_w = topk_w.p;
  b.slot_of_route = slot_of_route.p, b.xd = xd.p, b.hbuf = hbuf.p, b.ad = ad.p, b.ybuf = ybuf.p, b.xs = xs.p;
  b.as = as.p, b.counts = counts.p, b.route_of_slot = route_of_slot.p;
  return b;
}

void Engine::Impl::linear(const ops::GemmBf16Args& g) {
  if (deterministic || g.groups != 1 || !g.y_f32 || g.counts) {
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

void Engine::Impl::run(int64_t T, int64_t n_out, int64_t n_tiles) {
  embed_kernel<<<static_cast<unsigned>(T), 256, 0, stream>>>(tok_ids.p, embed.p, h.p, H);
  MOESQ_CUDA_LAUNCH_CHECK("embed_kernel");
  ops::RmsNormArgs rn;
  rn.x = h.p, rn.y = xb.p, rn.y_lo = xb_lo.p, rn.n = T, rn.D = H, rn.eps = s.rms_norm_eps;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const DevLayer& L = layers[l];
    rn.w = L.input_norm.p;
    ops::rmsnorm(rn, stream);
    ops::GemmBf16Args g;
    g.x = xb.p, g.x_lo = xb_lo.p, g.w = L.qkv.p, g.y_f32 = qkv.p, g.split_ws = gemm_split.p, g.M = T, g.N = qkv_w, g.K = H, g.ldy = qkv_w;
    linear(g);
    if (timing) MOESQ_CUDA_CHECK(cudaEventRecord(events[4 * l], stream));
    ops::QkRopeArgs qr;
    qr.qkv = qkv.p, qr.q_norm = L.q_norm.p, qr.k_norm = L.k_norm.p, qr.cos = rope_cos.p, qr.sin = rope_sin.p;
    qr.tok_slot = tok_slot.p, qr.tok_pos = tok_pos.p, qr.q_out = q.p, qr.k_cache = L.k_cache.p;
    qr.v_cache = L.v_cache.p, qr.T = T, qr.nh = static_cast<int>(nh), qr.nkv = static_cast<int>(nkv);
    qr.hd = static_cast<int>(hd), qr.max_len = max_len, qr.eps = s.rms_norm_eps;
    ops::qk_rope(qr, stream);
    ops::AttentionArgs at;
    at.q = q.p, at.k_cache = L.k_cache.p, at.v_cache = L.v_cache.p, at.tok_slot = tok_slot.p, at.tok_pos = tok_pos.p;
    at.out = attn.p, at.out_lo = attn_lo.p, at.T = T, at.nh = static_cast<int>(nh), at.nkv = static_cast<int>(nkv), at.hd = static_cast<int>(hd);
    at.max_len = max_len, at.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    if (n_tiles > 0)
      at.tiles = attn_tiles.p, at.n_tiles = n_tiles;
    else
      at.partial = attn_partial.p;
    ops::attention(at, stream);
    if (timing) MOESQ_CUDA_CHECK(cudaEventRecord(events[4 * l + 1], stream));
    g = ops::GemmBf16Args{};
    g.x = attn.p, g.x_lo = attn_lo.p, g.w = L.o.p, g.y_f32 = h.p, g.split_ws = gemm_split.p, g.accumulate = true, g.M = T, g.N = H, g.K = nh * hd, g.ldy = H;
    linear(g);
    rn.w = L.post_norm.p;
    ops::rmsnorm(rn, stream);
    if (timing) MOESQ_CUDA_CHECK(cudaEventRecord(events[4 * l + 2], stream));
    moe_block(moe_dims, moe_weights(L), moe_buffers(), xb.p, xb_lo.p, h.p, T, stream,
              [this](const ops::GemmBf16Args& rg) { linear(rg); });
    if (timing) MOESQ_CUDA_CHECK(cudaEventRecord(events[4 * l + 3], stream));
  }
  rn.w = final_norm.p;
  ops::rmsnorm(rn, stream);
  gather_rows_kernel<<<static_cast<unsigned>(n_out), 256, 0, stream>>>(xb.p, out_rows.p, xsel.p, H);
  gather_rows_kernel<<<static_cast<unsigned>(n_out), 256, 0, stream>>>(xb_lo.p, out_rows.p, xsel_lo.p, H);
  MOESQ_CUDA_LAUNCH_CHECK("gather_rows_kernel");
  ops::GemmBf16Args g;
  g.x = xsel.p, g.x_lo = xsel_lo.p, g.w = lm_head.p, g.y_f32 = logits.p, g.M = n_out, g.N = V, g.K = H, g.ldy = V;
  linear(g);
  argmax_kernel<<<static_cast<unsigned>(n_out), 256, 0, stream>>>(logits.p, V, next_ids.p);
  MOESQ_CUDA_LAUNCH_CHECK("argmax_kernel");
}

Engine::Engine(const io::Checkpoint& ckpt, const EngineOptions& opt)
    : Engine(load_host_model(ckpt, opt.experts), opt) {}

Engine::Engine(HostModel host, const EngineOptions& opt) : impl_(std::make_unique<Impl>()) {
  impl_->upload(std::move(host), opt);
}

Engine::Engine(const io::ModelSpec& spec, ExpertBackend backend, uint64_t seed, const EngineOptions& opt)
    : impl_(std::make_unique<Impl>()) {
  MOESQ_CHECK(backend == ExpertBackend::kBf16 || backend == ExpertBackend::kSparseW4A4 ||
                  backend == ExpertBackend::kSparseW4A16,
              "synthetic engine: expert backend ", expert_backend_name(backend), " is not built; built: ",
              built_expert_backends());
  Impl& m = *impl_;
  m.s = spec;
  m.host.spec = spec;
  m.host.backend = backend;
  m.host.expert_format = backend == ExpertBackend::kBf16 ? "bf16" : "paired-4:8-nvfp4";
  m.host.act_quant = backend == ExpertBackend::kSparseW4A4;
  m.host.act_block = m.host.act_quant ? 32 : 0;
  m.sizes(opt);
  m.synthesize(seed);
}

Engine::~Engine() = default;

const io::ModelSpec& Engine::spec() const { return impl_->s; }
ExpertBackend Engine::backend() const { return impl_->host.backend; }
const std::string& Engine::expert_format() const { return impl_->host.expert_format; }
bool Engine::act_quant() const { return impl_->host.act_quant; }
int Engine::act_block() const { return impl_->host.act_block; }
int Engine::max_seqs() const { return impl_->max_seqs; }
int64_t Engine::max_len() const { return impl_->max_len; }
size_t Engine::weight_bytes() const { return impl_->weight_bytes; }
size_t Engine::kv_bytes() const { return impl_->kv_bytes; }
void Engine::set_timing(bool on) { impl_->timing = on; }
double Engine::last_attention_ms() const { return impl_->attn_ms; }
double Engine::last_moe_ms() const { return impl_->moe_ms; }
void Engine::set_deterministic(bool on) {
  Impl& m = *impl_;
  if (m.deterministic == on) return;
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  for (auto& [b, g] : m.graphs) cudaGraphExecDestroy(g);
  m.graphs.clear();
  m.deterministic = on;
}
bool Engine::deterministic() const { return impl_->deterministic; }
void Engine::reset() { std::fill(impl_->lengths.begin(), impl_->lengths.end(), 0); }
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
  auto h2d = [&](Dev<int32_t>& d, const std::vector<int32_t>& v) {
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(d.p, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
  };
  h2d(m.tok_ids, ids), h2d(m.tok_slot, slot), h2d(m.tok_pos, pos), h2d(m.out_rows, rows);
  const std::vector<int32_t> tiles =
      ops::attention_tiles(slot.data(), pos.data(), T, static_cast<int>(m.nh), static_cast<int>(m.nkv));
  h2d(m.attn_tiles, tiles);
  m.run(T, static_cast<int64_t>(rows.size()), static_cast<int64_t>(tiles.size() / 2));
  std::vector<float> out(rows.size() * m.V);
  MOESQ_CUDA_CHECK(cudaMemcpyAsync(out.data(), m.logits.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost, m.stream));
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(m.stream));
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

std::vector<float> Engine::decode(const std::vector<int32_t>& tokens) {
  std::vector<float> out;
  decode_step(tokens, &out, nullptr);
  return out;
}

std::vector<int32_t> Engine::decode_greedy(const std::vector<int32_t>& tokens) {
  std::vector<int32_t> next;
  decode_step(tokens, nullptr, &next);
  return next;
}

void Engine::decode_step(const std::vector<int32_t>& tokens, std::vector<float>* logits, std::vector<int32_t>* next) {
  Impl& m = *impl_;
  const int B = static_cast<int>(tokens.size());
  MOESQ_CHECK(B >= 1 && B <= m.max_seqs && B <= m.max_tokens, "engine: decode batch ", B, " outside [1, ",
              std::min<int64_t>(m.max_seqs, m.max_tokens), "]");
  std::vector<int32_t> slot(B), pos(B), rows(B);
  for (int b = 0; b < B; ++b) {
    MOESQ_CHECK(tokens[b] >= 0 && tokens[b] < m.V, "engine: token id ", tokens[b], " outside the vocabulary");
    MOESQ_CHECK(m.lengths[b] < m.max_len, "engine: slot ", b, " is full (max_len ", m.max_len, ")");
    slot[b] = b, pos[b] = static_cast<int32_t>(m.lengths[b]), rows[b] = b;
  }
  auto h2d = [&](Dev<int32_t>& d, const std::vector<int32_t>& v) {
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(d.p, v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
  };
  h2d(m.tok_ids, tokens), h2d(m.tok_slot, slot), h2d(m.tok_pos, pos), h2d(m.out_rows, rows);
  auto it = m.graphs.find(B);
  if (it == m.graphs.end()) {
    // Eager once first (first-use work: attributes, cached device properties), then capture. The
    // eager step's KV writes are redone identically by the replay below (same positions).
    const bool timing = m.timing;
    m.timing = false;
    m.run(B, B, 0);
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    cudaGraph_t graph;
    MOESQ_CUDA_CHECK(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal));
    m.run(B, B, 0);
    MOESQ_CUDA_CHECK(cudaStreamEndCapture(m.stream, &graph));
    cudaGraphExec_t exec;
    MOESQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    it = m.graphs.emplace(B, exec).first;
    m.timing = timing;
  }
  MOESQ_CUDA_CHECK(cudaGraphLaunch(it->second, m.stream));
  if (logits) {
    logits->resize(static_cast<size_t>(B) * m.V);
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(logits->data(), m.logits.p, logits->size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     m.stream));
  }
  if (next) {
    next->resize(B);
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(next->data(), m.next_ids.p, B * sizeof(int32_t), cudaMemcpyDeviceToHost, m.stream));
  }
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  for (int b = 0; b < B; ++b) ++m.lengths[b];
}

}  // namespace moesq::runtime

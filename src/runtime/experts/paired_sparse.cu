// Device half of the paired 4:8 expert backends (paired_sparse.h): dispatch (+ NVFP4 act quant for
// W4A4) → gate|up sparse GEMM (fp32 out) → SwiGLU (+ requant) → down sparse GEMM (bf16 out), each GEMM's
// tile config from ops::sparse_gemm_heuristic for capacity T, the activation layout it reads from it.
#include <vector>

#include "core/cuda/dev_buf.cuh"
#include "core/env_switch.h"
#include "core/error.h"
#include "ops/sparse_gemm/sparse_gemm.h"
#include "ops/synth_pack/synth_pack.h"
#include "runtime/experts/expert_stage.h"
#include "runtime/experts/paired_sparse.h"
#include "runtime/experts/registry.h"
#include "runtime/layers/moe_block.h"

namespace moesq::runtime {

namespace {

// Decode-sized expert GEMMs run the routes kernel with the SwiGLU fused into the down GEMM (the same
// bits as without), unless MOESQ_SPARSE_ROUTES=0 (the same-run peer; bench/NOTES.md, session 28).
// Read once per process.
bool routes_kernel_enabled() {
  static const bool on = env_switch_on("MOESQ_SPARSE_ROUTES");
  return on;
}

// The largest capacity the routes kernel takes: MOESQ_ROUTES_MAX_TOKENS in [1, 64], else 8 (one chunk:
// the decode sizes it was measured at; bench/NOTES.md, session 29). Read once per process.
int routes_max_tokens() {
  static const int n = static_cast<int>(
      env_int("MOESQ_ROUTES_MAX_TOKENS", ops::kRoutesMaxTokens, 1, ops::kRoutesMaxChunkedTokens));
  return n;
}

// The paired 4:8 experts of one projection on the device.
struct DeviceProjection {
  DevBuf<uint8_t> w;          // [E, M_pad/16, K_pad/256, 1408] kernel layout
  DevBuf<float> inv_gamma;    // [E] 1/γ_w
  DevBuf<float> inv_gamma_hi; // [E] 1/γ_w of rows >= m_split (the reference's separate up γ), or empty
  int64_t M_pad = 0, m_split = 0;
  size_t bytes() const { return w.bytes() + inv_gamma.bytes() + inv_gamma_hi.bytes(); }
  const float* hi() const { return m_split > 0 ? inv_gamma_hi.p : nullptr; }

  // The one place γ_w is inverted: the GEMM epilogue multiplies by 1/γ_w. Experts [e0, e1) of k.
  void upload(const format::KernelWeights& k, int64_t e0, int64_t e1) {
    MOESQ_CHECK(e0 >= 0 && e0 <= e1 && e1 <= k.num_experts, "paired 4:8 experts: shard [", e0, ", ", e1,
                ") outside the layer's ", k.num_experts, " experts");
    const size_t per = k.expert_bytes();
    w.assign(k.data.data() + e0 * per, static_cast<size_t>(e1 - e0) * per);
    auto inverse = [&](const std::vector<float>& g) {
      std::vector<float> inv(static_cast<size_t>(e1 - e0));
      for (size_t e = 0; e < inv.size(); ++e) inv[e] = 1.0f / g[e0 + e];
      return inv;
    };
    inv_gamma.upload(inverse(k.gamma));
    if (!k.gamma_hi.empty()) {
      inv_gamma_hi.upload(inverse(k.gamma_hi));
      m_split = k.m_split;
    }
    M_pad = k.M_pad;
  }
};

class PairedSparseDeviceExperts final : public DeviceExperts {
 public:
  explicit PairedSparseDeviceExperts(bool act_quant) : quant_(act_quant) {}
  DeviceProjection gu;    // M = 2I, K_pad = H_pad
  DeviceProjection down;  // M = H, K_pad = I_pad
  // [E] static γ_a of each GEMM's input (every expert: the dispatch and SwiGLU index them by expert id),
  // or empty (per row).
  DevBuf<float> act_gamma_gu, act_gamma_down;

  size_t bytes() const override { return gu.bytes() + down.bytes() + act_gamma_gu.bytes() + act_gamma_down.bytes(); }

  void run(const ExpertStage& s, cudaStream_t stream) const override {
    const MoeBlockDims& dm = *s.dims;
    const MoeBlockBuffers& b = *s.buffers;
    const int E = static_cast<int>(dm.E), cap = static_cast<int>(s.T), max_tok = static_cast<int>(s.T);
    const int64_t H = dm.H, I = dm.I, H_pad = dm.H_pad, I_pad = dm.I_pad;
    // The GEMMs run the shard's experts: every per-expert buffer from expert e0 on, its counts. The
    // tile configs are the whole layer's (E), so a shard's rows have the one-GPU bits.
    const int64_t e0 = dm.expert_begin, slots0 = e0 * cap;
    const int En = static_cast<int>(dm.shard_size());
    const ops::GemmConfig c1 = ops::sparse_gemm_heuristic(E, 2 * I, H_pad, max_tok);
    ops::DispatchArgs d = stage_dispatch_args(s);
    d.quantize = quant_, d.layout = ops::sparse_gemm_act_layout(c1);
    d.x_lo = quant_ ? s.x_lo : nullptr;  // W4A4: quantize the near-fp32 row (hi + lo), as the CPU forward
    d.act_gamma = act_gamma_gu.n ? act_gamma_gu.p : nullptr;
    if (s.stages & kMoeDispatch) ops::act_dispatch(d, stream);
    ops::SparseGemmArgs g;
    g.w = gu.w.p, g.w_inv_gamma = gu.inv_gamma.p, g.w_inv_gamma_hi = gu.hi(), g.m_split = gu.m_split;
    g.x = b.xd + slots0 * H_pad, g.x_layout = d.layout;
    g.x_inv_scale = quant_ ? b.xs + slots0 : nullptr, g.counts = b.counts + e0, g.y = nullptr;
    g.y_f32 = b.hbuf + slots0 * 2 * I, g.num_experts = En;
    g.capacity = cap, g.M = 2 * I, g.M_pad = gu.M_pad, g.K_pad = H_pad, g.ldy = 2 * I;
    // The routes (router_topk's, two launches back): decode-sized calls start streaming the hit
    // experts' weights before the dispatch ends (ops/sparse_gemm/sparse_gemm_routes.cu).
    if (routes_kernel_enabled())
      g.route_experts = b.topk_ids, g.num_routes = s.T * dm.top_k, g.expert_begin = static_cast<int>(e0);
    g.routes_max_tokens = routes_max_tokens();
    if ((s.stages & kMoeGateUp) && En > 0) ops::sparse_gemm(g, max_tok, stream, &c1);
    const ops::GemmConfig c2 = ops::sparse_gemm_heuristic(E, H, I_pad, max_tok);
    ops::SwigluQuantArgs sw = stage_swiglu_args(s);
    sw.quantize = quant_, sw.layout = ops::sparse_gemm_act_layout(c2);
    sw.act_gamma = act_gamma_down.n ? act_gamma_down.p : nullptr;
    g.w = down.w.p, g.w_inv_gamma = down.inv_gamma.p, g.w_inv_gamma_hi = nullptr, g.m_split = 0;
    g.x = b.ad + slots0 * I_pad, g.x_layout = sw.layout;
    g.x_inv_scale = quant_ ? b.as + slots0 : nullptr, g.y = b.ybuf + slots0 * H, g.y_f32 = nullptr, g.M = H;
    g.M_pad = down.M_pad;
    g.K_pad = I_pad, g.ldy = H;
    // Decode sizes: the down GEMM's routes kernel makes its rows with the SwiGLU itself (the same bits);
    // the SwiGLU stage then launches nothing (bench_moe_layer times it inside the down GEMM).
    const bool fuse = En > 0 && ops::sparse_gemm_runs_routes(g, max_tok, &c2);
    g.fused_swiglu = fuse ? &sw : nullptr;
    if ((s.stages & kMoeSwiglu) && !fuse) ops::swiglu_quant(sw, stream);
    if ((s.stages & kMoeDown) && En > 0) ops::sparse_gemm(g, max_tok, stream, &c2);
  }

 private:
  bool quant_;
};

class PairedSparseDevice final : public ExpertBackendDevice {
 public:
  explicit PairedSparseDevice(bool act_quant) : quant_(act_quant) {}

  std::unique_ptr<DeviceExperts> upload(const HostExperts& host, const MoeBlockDims& d) const override {
    const auto* h = dynamic_cast<const PairedSparseHostExperts*>(&host);
    MOESQ_CHECK(h, "paired 4:8 expert backend: the host experts were loaded by another backend");
    auto out = std::make_unique<PairedSparseDeviceExperts>(quant_);
    MOESQ_CHECK(h->begin <= d.expert_begin && d.expert_end <= h->end, "paired 4:8 expert backend: the host holds "
                "experts [", h->begin, ", ", h->end, "), the engine runs [", d.expert_begin, ", ", d.expert_end, ")");
    out->gu.upload(h->gu, d.expert_begin - h->begin, d.expert_end - h->begin);
    out->down.upload(h->down, d.expert_begin - h->begin, d.expert_end - h->begin);
    if (!h->act_gamma_gu.empty()) {
      out->act_gamma_gu.upload(h->act_gamma_gu);
      out->act_gamma_down.upload(h->act_gamma_down);
    }
    return out;
  }

  std::unique_ptr<DeviceExperts> synthesize(const MoeBlockDims& d, const SeedFn& next_seed, float scale,
                                            cudaStream_t stream) const override {
    auto out = std::make_unique<PairedSparseDeviceExperts>(quant_);
    auto draw = [&](DeviceProjection& p, int64_t M, int64_t K_pad) {
      p.M_pad = (M + format::kMmaM - 1) / format::kMmaM * format::kMmaM;
      const int64_t per = (p.M_pad / format::kMmaM) * (K_pad / format::kChunkK), chunks = d.shard_size() * per;
      p.w.alloc(static_cast<size_t>(chunks) * format::kChunkBytes);
      ops::SynthSparseArgs a;
      a.out = p.w.p, a.num_chunks = chunks, a.first = d.expert_begin * per, a.seed = next_seed();
      ops::synth_sparse48_kl(a, stream);
      // E2M1 codes have rms ≈ 2.9 and the block scales average ≈ 0.72: 1/γ maps that to ≈ scale.
      p.inv_gamma.upload(std::vector<float>(d.shard_size(), scale / (2.9f * 0.72f)));
    };
    draw(out->gu, 2 * d.I, d.H_pad);
    draw(out->down, d.H, d.I_pad);
    return out;
  }

 private:
  bool quant_;
};

}  // namespace

const ExpertBackendDevice& sparse_w4a4_device() {
  static const PairedSparseDevice b(true);
  return b;
}

const ExpertBackendDevice& sparse_w4a16_device() {
  static const PairedSparseDevice b(false);
  return b;
}

}  // namespace moesq::runtime

// Device half of the bf16 expert backend (bf16.h): bf16 dispatch (kKMajor) → gate|up grouped GEMM
// (fp32 out) → SwiGLU (bf16, kKMajor) → down grouped GEMM (bf16 out).
#include "core/cuda/dev_buf.cuh"
#include "core/error.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/synth_pack/synth_pack.h"
#include "runtime/experts/bf16.h"
#include "runtime/experts/expert_stage.h"
#include "runtime/experts/registry.h"
#include "runtime/layers/moe_block.h"

namespace moesq::runtime {

namespace {

class Bf16DeviceExperts final : public DeviceExperts {
 public:
  DevBuf<uint16_t> gu;    // [shard, 2I, H_pad] bf16, kKMajor (the experts MoeBlockDims::expert_begin on)
  DevBuf<uint16_t> down;  // [shard, H, I_pad] bf16, kKMajor

  size_t bytes() const override { return gu.bytes() + down.bytes(); }

  void run(const ExpertStage& s, cudaStream_t stream) const override {
    const MoeBlockDims& dm = *s.dims;
    const MoeBlockBuffers& b = *s.buffers;
    const int cap = static_cast<int>(s.T);
    // The shard's experts (MoeBlockDims::expert_begin on): every per-expert buffer from there.
    const int64_t e0 = dm.expert_begin, slots0 = e0 * cap;
    const int En = static_cast<int>(dm.shard_size());
    ops::DispatchArgs d = stage_dispatch_args(s);
    d.quantize = false, d.layout = format::ActLayout::kKMajor;
    if (s.stages & kMoeDispatch) ops::act_dispatch(d, stream);
    ops::GemmBf16Args g;
    g.x = b.xd + slots0 * dm.H_pad, g.w = gu.p, g.y_f32 = b.hbuf + slots0 * 2 * dm.I, g.counts = b.counts + e0;
    g.groups = En, g.M = cap, g.N = 2 * dm.I, g.K = dm.H_pad, g.ldy = 2 * dm.I;
    if ((s.stages & kMoeGateUp) && En > 0) ops::gemm_bf16(g, stream);
    ops::SwigluQuantArgs sw = stage_swiglu_args(s);
    sw.quantize = false, sw.layout = format::ActLayout::kKMajor;
    if (s.stages & kMoeSwiglu) ops::swiglu_quant(sw, stream);
    g.x = b.ad + slots0 * dm.I_pad, g.w = down.p, g.y_f32 = nullptr, g.y_bf16 = b.ybuf + slots0 * dm.H;
    g.N = dm.H, g.K = dm.I_pad, g.ldy = dm.H;
    if ((s.stages & kMoeDown) && En > 0) ops::gemm_bf16(g, stream);
  }
};

class Bf16Device final : public ExpertBackendDevice {
 public:
  std::unique_ptr<DeviceExperts> upload(const HostExperts& host, const MoeBlockDims& d) const override {
    const auto* h = dynamic_cast<const Bf16HostExperts*>(&host);
    MOESQ_CHECK(h, "expert backend bf16: the host experts were loaded by another backend");
    MOESQ_CHECK(h->begin <= d.expert_begin && d.expert_begin <= d.expert_end && d.expert_end <= h->end,
                "expert backend bf16: the host holds experts [", h->begin, ", ", h->end, "), the engine runs [",
                d.expert_begin, ", ", d.expert_end, ")");
    auto out = std::make_unique<Bf16DeviceExperts>();
    const size_t gu_per = static_cast<size_t>(2 * d.I * d.H_pad), down_per = static_cast<size_t>(d.H * d.I_pad);
    const size_t first = static_cast<size_t>(d.expert_begin - h->begin), n = static_cast<size_t>(d.shard_size());
    MOESQ_CHECK(h->gu.size() == static_cast<size_t>(h->end - h->begin) * gu_per &&
                    h->down.size() == static_cast<size_t>(h->end - h->begin) * down_per,
                "expert backend bf16: host experts of another shape");
    out->gu.assign(h->gu.data() + first * gu_per, n * gu_per);
    out->down.assign(h->down.data() + first * down_per, n * down_per);
    return out;
  }

  std::unique_ptr<DeviceExperts> synthesize(const MoeBlockDims& d, const SeedFn& next_seed, float scale,
                                            cudaStream_t stream) const override {
    auto out = std::make_unique<Bf16DeviceExperts>();
    auto draw = [&](DevBuf<uint16_t>& buf, int64_t per_expert) {  // the shard's slice of the layer's tensor
      buf.alloc(static_cast<size_t>(d.shard_size() * per_expert));
      ops::SynthBf16Args a;
      a.out = buf.p, a.n = d.shard_size() * per_expert, a.first = d.expert_begin * per_expert;
      a.seed = next_seed(), a.scale = scale;
      ops::synth_bf16(a, stream);
    };
    draw(out->gu, 2 * d.I * d.H_pad);
    draw(out->down, d.H * d.I_pad);
    return out;
  }
};

}  // namespace

const ExpertBackendDevice& bf16_device() {
  static const Bf16Device b;
  return b;
}

}  // namespace moesq::runtime

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
  DevBuf<uint16_t> gu;    // [E, 2I, H_pad] bf16, kKMajor
  DevBuf<uint16_t> down;  // [E, H, I_pad] bf16, kKMajor

  size_t bytes() const override { return gu.bytes() + down.bytes(); }

  void run(const ExpertStage& s, cudaStream_t stream) const override {
    const MoeBlockDims& dm = *s.dims;
    const MoeBlockBuffers& b = *s.buffers;
    const int E = static_cast<int>(dm.E), cap = static_cast<int>(s.T);
    ops::DispatchArgs d = stage_dispatch_args(s);
    d.quantize = false, d.layout = format::ActLayout::kKMajor;
    if (s.stages & kMoeDispatch) ops::act_dispatch(d, stream);
    ops::GemmBf16Args g;
    g.x = b.xd, g.w = gu.p, g.y_f32 = b.hbuf, g.counts = b.counts, g.groups = E;
    g.M = cap, g.N = 2 * dm.I, g.K = dm.H_pad, g.ldy = 2 * dm.I;
    if (s.stages & kMoeGateUp) ops::gemm_bf16(g, stream);
    ops::SwigluQuantArgs sw = stage_swiglu_args(s);
    sw.quantize = false, sw.layout = format::ActLayout::kKMajor;
    if (s.stages & kMoeSwiglu) ops::swiglu_quant(sw, stream);
    g.x = b.ad, g.w = down.p, g.y_f32 = nullptr, g.y_bf16 = b.ybuf, g.N = dm.H, g.K = dm.I_pad, g.ldy = dm.H;
    if (s.stages & kMoeDown) ops::gemm_bf16(g, stream);
  }
};

class Bf16Device final : public ExpertBackendDevice {
 public:
  std::unique_ptr<DeviceExperts> upload(const HostExperts& host) const override {
    const auto* h = dynamic_cast<const Bf16HostExperts*>(&host);
    MOESQ_CHECK(h, "expert backend bf16: the host experts were loaded by another backend");
    auto out = std::make_unique<Bf16DeviceExperts>();
    out->gu.upload(h->gu);
    out->down.upload(h->down);
    return out;
  }

  std::unique_ptr<DeviceExperts> synthesize(const MoeBlockDims& d, const SeedFn& next_seed, float scale,
                                            cudaStream_t stream) const override {
    auto out = std::make_unique<Bf16DeviceExperts>();
    auto draw = [&](DevBuf<uint16_t>& buf, size_t n) {
      buf.alloc(n);
      ops::SynthBf16Args a;
      a.out = buf.p, a.n = static_cast<int64_t>(n), a.seed = next_seed(), a.scale = scale;
      ops::synth_bf16(a, stream);
    };
    draw(out->gu, d.E * 2 * d.I * d.H_pad);
    draw(out->down, d.E * d.H * d.I_pad);
    return out;
  }
};

}  // namespace

const ExpertBackendDevice& bf16_device() {
  static const Bf16Device b;
  return b;
}

}  // namespace moesq::runtime

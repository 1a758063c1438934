// Host side of the Gated DeltaNet block (gdn_block.h).
#include "runtime/layers/gdn_block.h"

#include "core/error.h"
#include "core/half.h"
#include "io/tensor_names.h"
#include "model/mixers/family_load.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/rmsnorm/rmsnorm.h"

namespace moesq::runtime {

GdnBlockDims gdn_block_dims(const io::FamilySpec& f) {
  GdnBlockDims d;
  d.H = f.base.hidden_size;
  d.nk = f.linear_num_key_heads, d.dk = f.linear_key_head_dim;
  d.nv = f.linear_num_value_heads, d.dv = f.linear_value_head_dim;
  d.Kc = f.linear_conv_kernel;
  d.eps = f.base.rms_norm_eps;
  return d;
}

std::string gdn_block_refusal(const io::FamilySpec& f) {
  const GdnBlockDims d = gdn_block_dims(f);
  std::string why;
  auto no = [&](bool bad, const std::string& what) {
    if (bad) why += (why.empty() ? "" : ", ") + what;
  };
  no(d.dk != 32 && d.dk != 64 && d.dk != 128 && d.dk != 256,
     "its linear_key_head_dim " + std::to_string(d.dk) + " is not 32, 64, 128 or 256");
  no(d.dv <= 0 || d.dv % 32 != 0 || d.dv * (d.dk / 32) > 512,
     "its linear_value_head_dim " + std::to_string(d.dv) + " is not a multiple of 32 with dv · dk/32 ≤ 512");
  no(d.nk <= 0 || d.nv <= 0 || d.nv % d.nk != 0, "its linear value heads are not a multiple of its key heads");
  no(d.Kc < 1 || d.Kc > ops::kGdnMaxConvKernel,
     "its linear_conv_kernel_dim " + std::to_string(d.Kc) + " is not in [1, " + std::to_string(ops::kGdnMaxConvKernel) + "]");
  no(d.H % 8 != 0 || d.value_dim() % 8 != 0, "its hidden size or value dim is not a multiple of 8");
  return why;
}

namespace {
void append_bf16(std::vector<uint16_t>& dst, const std::vector<float>& v) {
  for (float x : v) dst.push_back(f32_to_bf16(x));
}
}  // namespace

HostGdn load_host_gdn(const io::Checkpoint& ckpt, const io::FamilySpec& f, int64_t l) {
  const model::GdnShape g = model::family_gdn_shape(f);
  model::GdnWeights w;
  model::family_load::load_gdn(ckpt, f, g, l, w);
  HostGdn h;
  h.input_norm = model::family_load::norm_multiplier(ckpt, l, io::kInputNorm, f.base.hidden_size, f.zero_centered_norms);
  const GdnBlockDims d = gdn_block_dims(f);
  h.in_proj.reserve(static_cast<size_t>(d.proj_cols() * d.H));
  append_bf16(h.in_proj, w.in_proj_qkv);
  append_bf16(h.in_proj, w.in_proj_z);
  append_bf16(h.in_proj, w.in_proj_b);
  append_bf16(h.in_proj, w.in_proj_a);
  h.conv1d = std::move(w.conv1d);  // [C, 1, Kc] as stored = [C, Kc]
  h.dt_bias = std::move(w.dt_bias);
  h.A_log = std::move(w.A_log);
  h.norm = std::move(w.norm);
  append_bf16(h.out_proj, w.out_proj);
  return h;
}

void gdn_block_ref(const GdnBlockDims& d, const HostGdn& w, const ops::GdnRuns& runs, float* window, float* S,
                   int64_t T, float* h) {
  if (T == 0) return;
  const int64_t H = d.H, C = d.conv_dim(), Vd = d.value_dim(), P = d.proj_cols();
  std::vector<uint16_t> xb(T * H), xb_lo(T * H);
  ops::RmsNormArgs rn;
  rn.x = h, rn.w = w.input_norm.data(), rn.y = xb.data(), rn.y_lo = xb_lo.data(), rn.n = T, rn.D = H, rn.eps = d.eps;
  ops::rmsnorm_ref(rn);
  std::vector<float> proj(T * P), qkv(T * C);
  ops::GemmBf16Args g;
  g.x = xb.data(), g.x_lo = xb_lo.data(), g.w = w.in_proj.data(), g.y_f32 = proj.data(), g.M = T, g.N = P, g.K = H, g.ldy = P;
  ops::gemm_bf16_ref(g);
  ops::GdnConvArgs cv;
  cv.x = proj.data(), cv.ldx = P, cv.w = w.conv1d.data(), cv.window = window, cv.out = qkv.data(), cv.runs = runs;
  cv.C = static_cast<int>(C), cv.Kc = static_cast<int>(d.Kc);
  ops::gdn_conv_ref(cv);
  std::vector<uint16_t> o_hi(T * Vd), o_lo(T * Vd);
  ops::GdnRecurrenceArgs r;
  r.qkv = qkv.data(), r.z = proj.data() + C, r.b = proj.data() + C + Vd, r.a = proj.data() + C + Vd + d.nv, r.ldz = P;
  r.A_log = w.A_log.data(), r.dt_bias = w.dt_bias.data(), r.norm = w.norm.data(), r.S = S;
  r.out_hi = o_hi.data(), r.out_lo = o_lo.data(), r.runs = runs;
  r.nk = static_cast<int>(d.nk), r.dk = static_cast<int>(d.dk), r.nv = static_cast<int>(d.nv);
  r.dv = static_cast<int>(d.dv), r.eps = d.eps;
  ops::gdn_recurrence_ref(r);
  g = {};
  g.x = o_hi.data(), g.x_lo = o_lo.data(), g.w = w.out_proj.data(), g.y_f32 = h, g.accumulate = true;
  g.M = T, g.N = H, g.K = Vd, g.ldy = H;
  ops::gemm_bf16_ref(g);
}

}  // namespace moesq::runtime

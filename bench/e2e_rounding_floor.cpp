// e2e_rounding_floor CKPT [aq]: how far ONE rounding moves per-window nats on a checkpoint, i.e. the
// floor under any GPU-vs-CPU eval tolerance (bench/NOTES.md e2e v4). The CPU forward is re-run with fp64
// dot products and exactly one (or a named set) of the GPU engine's roundings applied: K/V cache
// (kv), q/k/v projection outputs (qkv_out), attention output (attn_out), expert input (xin; xin_hilo:
// the hi + lo pair), gate/up outputs (gu), SwiGLU output (act), expert output (down), router input
// (routerx); `aq` adds the W4A4 NVFP4 activation quantizer. Diffs vs DecoderModel::window_nll (fp32
// OpenBLAS), the same four windows as tests/gpu/test_engine.cu. Slow (plain loops): minutes.
#include <cmath>
#include <cstdio>
#include <random>
#include <numeric>
#include <algorithm>
#include <cstring>
#include <string>
#include "core/half.h"
#include "core/swiglu.h"
#include "format/nvfp4.h"
#include "io/checkpoint.h"
#include "model/rope.h"
#include "model/tensor_math.h"
#include "support/text_tokens.h"
#include "model/decoder.h"
using namespace moesq;
enum { KV = 1, XIN = 2, GU = 4, ACT = 8, DOWN = 16, XINHL = 32, QB=64, ATTNO=128, ROUTERX=256 };
static void rb(float* x, int64_t n) { for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]); }
static void rhl(float* x, int64_t n) { for (int64_t i = 0; i < n; ++i) { float h = round_bf16(x[i]); x[i] = h + round_bf16(x[i] - h); } }
static void lin(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y) {
  for (int64_t m = 0; m < M; ++m) for (int64_t n = 0; n < N; ++n) { double a = 0; for (int64_t k = 0; k < K; ++k) a += (double)x[m*K+k]*W[n*K+k]; y[m*N+n] = (float)a; }
}
using moesq::test::text_tokens;
double nll_of(const std::vector<float>& z, int64_t V, const std::vector<int32_t>& tok) { return model::next_token_nll(z.data(), tok, V); }
std::vector<float> fwd(const model::DecoderModel& m, const std::vector<int32_t>& tok, int flags, bool aq) {
  const auto& s = m.spec();
  const int64_t T = tok.size(), H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads, E = s.num_experts, I = s.moe_intermediate_size, K = s.top_k;
  std::vector<float> h = m.embed(tok);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const auto& L = m.layer(l);
    std::vector<float> x(T*H); model::rmsnorm_rows(h.data(), T, H, L.input_norm.data(), s.rms_norm_eps, x.data());
    std::vector<float> q(T*nh*hd), k(T*nkv*hd), v(T*nkv*hd);
    lin(x.data(), T, H, L.q_proj.data(), nh*hd, q.data()); lin(x.data(), T, H, L.k_proj.data(), nkv*hd, k.data()); lin(x.data(), T, H, L.v_proj.data(), nkv*hd, v.data());
    if (flags & QB) { rb(q.data(), q.size()); rb(k.data(), k.size()); rb(v.data(), v.size()); }
    model::rmsnorm_rows(q.data(), T*nh, hd, L.q_norm.data(), s.rms_norm_eps, q.data());
    model::rmsnorm_rows(k.data(), T*nkv, hd, L.k_norm.data(), s.rms_norm_eps, k.data());
    std::vector<float> c, sn; model::rope_tables(T, hd, s.rope_theta, c, sn);
    for (int64_t t = 0; t < T; ++t) { for (int64_t i = 0; i < nh; ++i) model::apply_rope(&q[(t*nh+i)*hd], hd, &c[t*hd/2], &sn[t*hd/2]); for (int64_t i = 0; i < nkv; ++i) model::apply_rope(&k[(t*nkv+i)*hd], hd, &c[t*hd/2], &sn[t*hd/2]); }
    if (flags & KV) { rb(k.data(), k.size()); rb(v.data(), v.size()); }
    std::vector<float> at(T*nh*hd, 0.f), p(T);
    const float sc = 1.0f / std::sqrt((float)hd);
    for (int64_t i = 0; i < nh; ++i) { int64_t kv = i / (nh/nkv);
      for (int64_t t = 0; t < T; ++t) { float mx = -INFINITY; for (int64_t j = 0; j <= t; ++j) { double d = 0; for (int64_t e = 0; e < hd; ++e) d += (double)q[(t*nh+i)*hd+e]*k[(j*nkv+kv)*hd+e]; p[j] = (float)d*sc; mx = std::max(mx, p[j]); }
        double sum = 0; for (int64_t j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j]-mx));
        for (int64_t e = 0; e < hd; ++e) { double a = 0; for (int64_t j = 0; j <= t; ++j) a += (double)p[j]*v[(j*nkv+kv)*hd+e]; at[(t*nh+i)*hd+e] = (float)(a/sum); } } }
    if (flags & ATTNO) rb(at.data(), at.size());
    std::vector<float> o(T*H); lin(at.data(), T, nh*hd, L.o_proj.data(), H, o.data());
    for (int64_t i = 0; i < T*H; ++i) h[i] += o[i];
    std::vector<float> xm = m.moe_input(l, h, T);
    std::vector<float> xr = xm; if (flags & ROUTERX) rb(xr.data(), xr.size());
    model::Routes r = m.route(l, xr, T);
    std::vector<float> y(T*H, 0.f);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int64_t> sl(K); std::iota(sl.begin(), sl.end(), 0);
      std::sort(sl.begin(), sl.end(), [&](int64_t a, int64_t b){ return r.expert[t*K+a] < r.expert[t*K+b]; });
      for (int64_t j : sl) { const int e = r.expert[t*K+j]; const auto& W = L.experts[e];
        std::vector<float> xi(&xm[t*H], &xm[t*H]+H);
        if (flags & XIN) rb(xi.data(), H); else if (flags & XINHL) rhl(xi.data(), H);
        if (aq) format::quantize_activation_row(xi.data(), H, 32);
        std::vector<float> g(I), u(I), a(I), ye(H);
        lin(xi.data(), 1, H, W.gate.data(), I, g.data()); lin(xi.data(), 1, H, W.up.data(), I, u.data());
        if (flags & GU) { rb(g.data(), I); rb(u.data(), I); }
        for (int64_t i = 0; i < I; ++i) a[i] = silu_mul(g[i], u[i]);
        if (flags & ACT) rb(a.data(), I);
        if (aq) format::quantize_activation_row(a.data(), I, 32);
        lin(a.data(), 1, I, W.down.data(), H, ye.data());
        if (flags & DOWN) rb(ye.data(), H);
        for (int64_t cc = 0; cc < H; ++cc) y[t*H+cc] += ye[cc] * r.weight[t*K+j]; } }
    for (int64_t i = 0; i < T*H; ++i) h[i] += y[i];
  }
  return m.logits(h, T);
}
int main(int argc, char** argv) {
  if (argc < 2) { std::fprintf(stderr, "usage: e2e_rounding_floor CKPT [aq]\n"); return 2; }
  io::Checkpoint ck(argv[1]); model::DecoderModel m(ck); bool aq = argc > 2 && std::string(argv[2]) == "aq";
  model::ForwardOptions fo = m.default_forward_options(); fo.act_quant = aq; fo.act_block = 32; fo.threads = 1;
  std::vector<std::vector<int32_t>> w; for (int i = 0; i < 4; ++i) w.push_back(text_tokens(100 + 20*i, 40+i));
  std::vector<double> base; for (auto& t : w) { int64_t p; base.push_back(m.window_nll(t, fo, &p)); }
  std::vector<std::pair<const char*, int>> cfg = {{"none",0},{"kv",KV},{"qkv_out",QB},{"attn_out",ATTNO},{"xin",XIN},{"xin_hilo",XINHL},{"gu",GU},{"act",ACT},{"down",DOWN},{"routerx",ROUTERX},{"engine(kv,xin,gu,act,down)",KV|XIN|GU|ACT|DOWN},{"fix1(kv,xinhl,gu,act,down)",KV|XINHL|GU|ACT|DOWN},{"kv+xinhl",KV|XINHL}};
  if (aq) cfg = {{"none",0},{"kv",KV},{"xin",XIN},{"gu",GU},{"act",ACT},{"down",DOWN},{"engine(kv,xin,gu,act,down)",KV|XIN|GU|ACT|DOWN},{"fixA(kv,xinhl,down)",KV|XINHL|DOWN},{"fixB(kv,xinhl,act,down)",KV|XINHL|ACT|DOWN},{"fixC(kv,xinhl,gu,down)",KV|XINHL|GU|DOWN}};
  for (auto& [n, f] : cfg) { std::printf("%-28s", n); double mx = 0; for (size_t i = 0; i < w.size(); ++i) { double d = nll_of(fwd(m, w[i], f, aq), m.spec().vocab_size, w[i]) - base[i]; mx = std::max(mx, std::fabs(d)); std::printf(" %+.2e", d); } std::printf("  max %.2e\n", mx); }
}

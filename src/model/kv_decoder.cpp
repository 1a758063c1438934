#include "model/kv_decoder.h"

#include <cmath>

#include "core/error.h"
#include "model/rope.h"
#include "model/tensor_math.h"

namespace moesq::model {

namespace {

// y[r] = Σ_c W[r, c] x[c], W: [rows, cols]
void matvec(const std::vector<float>& W, const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* w = W.data() + r * cols;
    float acc = 0;
    for (int64_t c = 0; c < cols; ++c) acc += w[c] * x[c];
    y[r] = acc;
  }
}

}  // namespace

KvDecoder::KvDecoder(const DecoderModel& m, int64_t max_len, const ForwardOptions& fo)
    : m_(m), fo_(fo), max_len_(max_len) {
  const auto& s = m.spec();
  k_cache_.resize(static_cast<size_t>(s.num_layers));
  v_cache_.resize(static_cast<size_t>(s.num_layers));
  mixer_state_.resize(static_cast<size_t>(s.num_layers));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (const Mixer* mx = m.layer(l).mixer.get()) {
      mixer_state_[l] = mx->new_decode_state(max_len, fo);
      MOESQ_CHECK(mixer_state_[l], "KV-cached decoding: layer ", l, " has a ", mx->name(),
                  " mixer, which has no decode path");
      continue;
    }
    k_cache_[l].assign(static_cast<size_t>(max_len * s.num_kv_heads * s.head_dim), 0.0f);
    v_cache_[l].assign(static_cast<size_t>(max_len * s.num_kv_heads * s.head_dim), 0.0f);
  }
  rope_tables(max_len, s.head_dim, s.rope_theta, cos_, sin_, fo.rope_bf16_inv_freq);
}

int64_t KvDecoder::cache_bytes(const DecoderModel& m, int64_t max_len) {
  const auto& s = m.spec();
  __int128 bytes = state_bytes(2 * static_cast<__int128>(max_len) * (s.head_dim / 2));  // cos_, sin_
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (const Mixer* mx = m.layer(l).mixer.get()) {
      try {
        bytes += mx->decode_state_bytes(max_len);
      } catch (const Error&) {
        MOESQ_FAIL("KV-cached decoding: layer ", l, " has a ", mx->name(), " mixer, which has no decode path");
      }
      continue;
    }
    bytes += state_bytes(2 * static_cast<__int128>(max_len) * s.num_kv_heads * s.head_dim);  // k_cache_, v_cache_
  }
  return bytes > static_cast<__int128>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(bytes);
}

void KvDecoder::ffn_step(int64_t l, std::vector<float>& h) const {
  const std::vector<float> xm = m_.moe_input(l, h, 1);
  const std::vector<float> y = m_.ffn_block(l, xm, 1, fo_);
  for (size_t i = 0; i < h.size(); ++i) h[i] += y[i];
}

std::vector<float> KvDecoder::step(int32_t token) {
  MOESQ_CHECK(pos_ < max_len_, "decoder: sequence longer than its max length ", max_len_);
  const auto& s = m_.spec();
  const int64_t H = s.hidden_size, nh = s.num_heads, nkv = s.num_kv_heads, hd = s.head_dim;
  const int64_t group = nh / nkv;
  std::vector<float> h = m_.embed({token});  // [1, H]
  std::vector<float> x(H), q(nh * hd), attn(nh * hd), o(H);
  std::vector<float> scores(static_cast<size_t>(pos_ + 1));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const LayerWeights& w = m_.layer(l);
    rmsnorm_rows(h.data(), 1, H, w.input_norm.data(), s.rms_norm_eps, x.data());
    if (w.mixer) {
      const std::vector<float> y = w.mixer->decode(x.data(), 1, *mixer_state_[l], fo_);  // [1, H]
      for (int64_t i = 0; i < H; ++i) h[i] += y[i];
      ffn_step(l, h);
      continue;
    }
    float* kc = k_cache_[l].data() + pos_ * nkv * hd;
    float* vc = v_cache_[l].data() + pos_ * nkv * hd;
    matvec(w.q_proj, x.data(), q.data(), nh * hd, H);
    matvec(w.k_proj, x.data(), kc, nkv * hd, H);
    matvec(w.v_proj, x.data(), vc, nkv * hd, H);
    add_bias_rows(q.data(), 1, nh * hd, w.q_bias);
    add_bias_rows(kc, 1, nkv * hd, w.k_bias);
    add_bias_rows(vc, 1, nkv * hd, w.v_bias);
    if (s.qk_norm == io::QkNorm::Whole) {  // OLMoE: one RMSNorm over the whole projection
      rmsnorm_rows(q.data(), 1, nh * hd, w.q_norm.data(), s.rms_norm_eps, q.data());
      rmsnorm_rows(kc, 1, nkv * hd, w.k_norm.data(), s.rms_norm_eps, kc);
    }
    const bool per_head = s.qk_norm == io::QkNorm::PerHead;
    for (int64_t a = 0; a < nh; ++a) {
      if (per_head) rmsnorm_rows(q.data() + a * hd, 1, hd, w.q_norm.data(), s.rms_norm_eps, q.data() + a * hd);
      apply_rope(q.data() + a * hd, hd, cos_.data() + pos_ * (hd / 2), sin_.data() + pos_ * (hd / 2));
    }
    for (int64_t a = 0; a < nkv; ++a) {
      if (per_head) rmsnorm_rows(kc + a * hd, 1, hd, w.k_norm.data(), s.rms_norm_eps, kc + a * hd);
      apply_rope(kc + a * hd, hd, cos_.data() + pos_ * (hd / 2), sin_.data() + pos_ * (hd / 2));
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int64_t a = 0; a < nh; ++a) {
      const int64_t kvh = a / group;
      // Sliding-window layer: the keys t with pos − t < window (the whole prefix stays cached).
      const int64_t lo = w.attention_window > 0 ? std::max<int64_t>(0, pos_ - w.attention_window + 1) : 0;
      float mx = -INFINITY;
      for (int64_t t = lo; t <= pos_; ++t) {
        const float* kt = k_cache_[l].data() + (t * nkv + kvh) * hd;
        float d = 0;
        for (int64_t i = 0; i < hd; ++i) d += q[a * hd + i] * kt[i];
        scores[t] = d * scale;
        mx = std::max(mx, scores[t]);
      }
      float sum = 0;
      for (int64_t t = lo; t <= pos_; ++t) sum += (scores[t] = std::exp(scores[t] - mx));
      float* out = attn.data() + a * hd;
      std::fill(out, out + hd, 0.0f);
      for (int64_t t = lo; t <= pos_; ++t) {
        const float p = scores[t] / sum;
        const float* vt = v_cache_[l].data() + (t * nkv + kvh) * hd;
        for (int64_t i = 0; i < hd; ++i) out[i] += p * vt[i];
      }
    }
    matvec(w.o_proj, attn.data(), o.data(), H, nh * hd);
    add_bias_rows(o.data(), 1, H, w.o_bias);
    for (int64_t i = 0; i < H; ++i) h[i] += o[i];
    ffn_step(l, h);
  }
  ++pos_;
  return m_.logits(h, 1);
}

}  // namespace moesq::model

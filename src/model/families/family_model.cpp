// Decoder skeleton of the family models (see the header). The non-obvious decision: the final
// norm, the input/post norms and the per-head q/k norms all go through rmsnorm_rows with a
// multiplier vector, and zero-centred norms (Qwen3-Next/3.5: y = x/rms · (1 + w)) get (1 + w)
// folded in once at load, in fp32 as transformers computes it — one norm routine for both families.
#include "model/families/family_model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/ops.h"
#include "model/routers/routers.h"

namespace moesq::model {

FamilyModel::FamilyModel(const io::Checkpoint& ckpt, const FamilyLoadOptions& lo)
    : fam_(io::parse_family_config(ckpt.config(), ckpt.dir() + "/config.json")) {
  fam_.rope.inv_freq_bf16 = lo.rope_inv_freq_bf16;
  MOESQ_CHECK(fam_.base.model_type != "gpt_oss", ckpt.dir(),
              ": gpt_oss runs in model::DecoderModel (model/mixers/sink_attention.h), not FamilyModel");
  layers_.resize(fam_.base.num_layers);
  load_qwen3_next_family(ckpt, fam_, *this);
}

AttentionShape family_attention_shape(const io::FamilySpec& f, int64_t l) {
  const io::ModelSpec& s = f.base;
  AttentionShape a;
  a.hidden = s.hidden_size;
  a.num_heads = s.num_heads;
  a.num_kv_heads = s.num_kv_heads;
  a.head_dim = s.head_dim;
  a.output_gate = f.attn_output_gate;
  a.window = f.layer_mixer.at(l) == io::MixerKind::SlidingAttention ? f.sliding_window : 0;
  a.eps = s.rms_norm_eps;
  a.rope = f.rope;
  return a;
}

GdnShape family_gdn_shape(const io::FamilySpec& f) {
  GdnShape g;
  g.hidden = f.base.hidden_size;
  g.num_k_heads = f.linear_num_key_heads;
  g.head_k_dim = f.linear_key_head_dim;
  g.num_v_heads = f.linear_num_value_heads;
  g.head_v_dim = f.linear_value_head_dim;
  g.conv_kernel = f.linear_conv_kernel;
  g.eps = f.base.rms_norm_eps;
  return g;
}

AttentionShape FamilyModel::attention_shape(int64_t l) const { return family_attention_shape(fam_, l); }
GdnShape FamilyModel::gdn_shape() const { return family_gdn_shape(fam_); }

std::vector<float> FamilyModel::embed(const std::vector<int32_t>& tokens) const {
  const int64_t H = spec().hidden_size;
  std::vector<float> h(tokens.size() * H);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int32_t id = tokens[t];
    MOESQ_CHECK(id >= 0 && id < spec().vocab_size, "token id ", id, " at position ", t,
                " is outside the vocabulary [0, ", spec().vocab_size, ")");
    std::memcpy(&h[t * H], &embed_[static_cast<int64_t>(id) * H], H * sizeof(float));
  }
  return h;
}

void FamilyModel::mixer_block(int64_t l, std::vector<float>& h, int64_t T, DecodeState* st, int threads) const {
  const int64_t H = spec().hidden_size;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == T * H, "mixer_block: h has ", h.size(), " values, expected T·H = ", T * H);
  const FamilyLayer& L = layers_.at(l);
  std::vector<float> x(T * H), y(T * H);
  rmsnorm_rows(h.data(), T, H, L.input_norm.data(), spec().rms_norm_eps, x.data());
  if (fam_.layer_mixer[l] == io::MixerKind::GatedDeltaNet)
    gated_deltanet_forward(gdn_shape(), L.gdn, x.data(), T, y.data(), st ? &st->gdn.at(l) : nullptr, threads);
  else
    attention_forward(attention_shape(l), L.attn, x.data(), T, y.data(), st ? &st->kv.at(l) : nullptr, threads);
  for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
}

void FamilyModel::mixer_block_ref(int64_t l, std::vector<float>& h, int64_t T) const {
  const int64_t H = spec().hidden_size;
  const FamilyLayer& L = layers_.at(l);
  std::vector<float> x(T * H), y(T * H);
  rmsnorm_rows(h.data(), T, H, L.input_norm.data(), spec().rms_norm_eps, x.data());
  if (fam_.layer_mixer[l] == io::MixerKind::GatedDeltaNet)
    gated_deltanet_forward_ref(gdn_shape(), L.gdn, x.data(), T, y.data());
  else
    attention_forward_ref(attention_shape(l), L.attn, x.data(), T, y.data());
  for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
}

std::vector<float> FamilyModel::moe_input(int64_t l, const std::vector<float>& h, int64_t n) const {
  const int64_t H = spec().hidden_size;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == n * H, "moe_input: h has ", h.size(), " values, expected n·H = ", n * H);
  std::vector<float> x(n * H);
  rmsnorm_rows(h.data(), n, H, layers_.at(l).post_norm.data(), spec().rms_norm_eps, x.data());
  return x;
}

Routes FamilyModel::route(int64_t l, const float* x, int64_t n) const {
  const FamilyLayer& L = layers_.at(l);
  MOESQ_CHECK(!L.router.empty(), "route: layer ", l, " is a dense MLP layer");
  const io::ModelSpec& s = spec();
  return softmax_topk_route(L.router, s.num_experts, s.hidden_size, x, n, s.top_k, s.norm_topk_prob);
}

std::vector<float> FamilyModel::expert_forward(int64_t l, int64_t e, const float* x, int64_t n) const {
  const FamilyLayer& L = layers_.at(l);
  const int64_t H = spec().hidden_size, I = spec().moe_intermediate_size;
  const ExpertWeights& W = L.experts.at(e);
  return swiglu_forward(W.gate.data(), W.up.data(), W.down.data(), H, I, x, n, 0);
}

std::vector<float> FamilyModel::mlp_block(int64_t l, const std::vector<float>& x, const Routes* r, int64_t n,
                                          int threads) const {
  const FamilyLayer& L = layers_.at(l);
  const int64_t H = spec().hidden_size;
  if (L.router.empty()) {
    const int64_t I = spec().intermediate_size;
    const ExpertWeights& W = L.dense_mlp;
    return swiglu_forward(W.gate.data(), W.up.data(), W.down.data(), H, I, x.data(), n, 0);
  }
  MOESQ_CHECK(r && r->n == n, "mlp_block: layer ", l, " needs the routes of its ", n, " rows");
  std::vector<float> y = routed_combine(
      *r, spec().num_experts, H, x.data(),
      [&](int64_t e, const float* xe, int64_t ne) { return expert_forward(l, e, xe, ne); }, threads);
  if (!L.shared_expert.gate.empty()) {
    const std::vector<float> ys = gated_shared_expert(L.shared_expert, L.shared_expert_gate, H,
                                                      fam_.shared_expert_intermediate_size, x.data(), n);
    for (int64_t i = 0; i < n * H; ++i) y[i] += ys[i];
  }
  return y;
}

Routes FamilyModel::layer_forward(int64_t l, std::vector<float>& h, int64_t T, DecodeState* st, int threads) const {
  mixer_block(l, h, T, st, threads);
  const std::vector<float> x = moe_input(l, h, T);
  Routes r;
  if (is_moe_layer(l)) r = route(l, x.data(), T);
  const std::vector<float> y = mlp_block(l, x, is_moe_layer(l) ? &r : nullptr, T, threads);
  for (size_t i = 0; i < h.size(); ++i) h[i] += y[i];
  return r;
}

std::vector<float> FamilyModel::final_norm(const std::vector<float>& h, int64_t T) const {
  const int64_t H = spec().hidden_size;
  std::vector<float> x(T * H);
  rmsnorm_rows(h.data(), T, H, final_norm_.data(), spec().rms_norm_eps, x.data());
  return x;
}

std::vector<float> FamilyModel::logits(const std::vector<float>& h, int64_t T) const {
  const int64_t H = spec().hidden_size, V = spec().vocab_size;
  const std::vector<float> x = final_norm(h, T);
  std::vector<float> z(T * V);
  if (T > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(T), static_cast<int>(V), static_cast<int>(H),
                1.0f, x.data(), static_cast<int>(H), lm_head_.data(), static_cast<int>(H), 0.0f, z.data(),
                static_cast<int>(V));
  return z;
}

std::vector<float> FamilyModel::forward(const std::vector<int32_t>& tokens, FamilyTrace* trace, int threads) const {
  const int64_t T = static_cast<int64_t>(tokens.size()), L = spec().num_layers;
  spec().check_seq_len(T, "sequence length");
  std::vector<float> h = embed(tokens);
  if (trace) {
    *trace = FamilyTrace{};
    trace->hidden.push_back(h);
  }
  for (int64_t l = 0; l < L; ++l) {
    Routes r = layer_forward(l, h, T, nullptr, threads);
    if (trace) {
      trace->hidden.push_back(l + 1 < L ? h : final_norm(h, T));
      trace->router_logits.push_back(r.logits);
      trace->routes.push_back(std::move(r));
    }
  }
  return logits(h, T);
}

DecodeState FamilyModel::new_decode_state() const {
  DecodeState st;
  st.kv.resize(spec().num_layers);
  st.gdn.resize(spec().num_layers);
  for (int64_t l = 0; l < spec().num_layers; ++l)
    if (fam_.layer_mixer[l] == io::MixerKind::GatedDeltaNet) st.gdn[l] = gdn_initial_state(gdn_shape());
  return st;
}

std::vector<float> FamilyModel::decode(const std::vector<int32_t>& tokens, DecodeState& st, int threads) const {
  const int64_t T = static_cast<int64_t>(tokens.size());
  MOESQ_CHECK(static_cast<int64_t>(st.kv.size()) == spec().num_layers, "decode: state made for another model");
  spec().check_seq_len(st.pos + T, "decode position");
  std::vector<float> h = embed(tokens);
  for (int64_t l = 0; l < spec().num_layers; ++l) layer_forward(l, h, T, &st, threads);
  st.pos += T;
  return logits(h, T);
}

double FamilyModel::window_nll(const std::vector<int32_t>& tokens, int64_t* predicted, int threads) const {
  const int64_t T = static_cast<int64_t>(tokens.size()), V = spec().vocab_size;
  MOESQ_CHECK(T >= 2, "window_nll: a window needs at least 2 tokens, got ", T);
  const std::vector<float> z = forward(tokens, nullptr, threads);
  if (predicted) *predicted = T - 1;
  return next_token_nll(z.data(), tokens, V);
}

}  // namespace moesq::model

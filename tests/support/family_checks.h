// Test support: the fixture checks every family test runs on a model::DecoderModel against its
// FamilyReference (tests/support/family_reference.h). Each returns the worst error it saw; the
// test owns the tolerance.
#pragma once
#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "model/tensor_math.h"
#include "support/family_reference.h"

namespace moesq::test {

struct LayerParity {
  double hidden = 0.0;      // max |h_out − ref| over layers and sequences (last layer after the final norm)
  double router = 0.0;      // max |router logits − ref|
  double min_peak = 1e30;   // smallest per-layer max |h_out| (an all-zero output would be a bug)
  int64_t topk_bad = 0;     // tokens whose top-k set differs where the reference gap exceeds tie_gap
  int64_t ties = 0;         // tokens whose set differs inside a near-tie
};

// Every decoder layer run TEACHER-FORCED on the reference input of that layer.
inline LayerParity teacher_forced_parity(const model::DecoderModel& m, const model::ForwardOptions& fo,
                                         const FamilyReference& ref, double tie_gap) {
  const auto& s = m.spec();
  const int64_t T = ref.T, H = s.hidden_size, E = s.num_experts, L = s.num_layers;
  LayerParity p;
  for (int64_t b = 0; b < ref.B; ++b)
    for (int64_t l = 0; l < L; ++l) {
      const float* in = &ref.hidden[l][b * T * H];
      std::vector<float> h(in, in + T * H);
      const model::Routes r = m.layer_forward(l, h, T, fo);
      const std::vector<float> out = l + 1 < L ? h : m.final_norm(h, T);
      p.hidden = std::max(p.hidden, max_abs_diff(out.data(), &ref.hidden[l + 1][b * T * H], T * H));
      p.min_peak = std::min(p.min_peak, max_abs(out));
      if (ref.router[l].empty() || r.logits.empty()) continue;
      p.router = std::max(p.router, max_abs_diff(r.logits.data(), &ref.router[l][b * T * E], T * E));
      p.topk_bad += topk_mismatches(r.expert, r.k, &ref.router[l][b * T * E], T, E, tie_gap, &p.ties);
    }
  return p;
}

// Each layer's mixer: fast path vs its plain-loop twin on the reference input of that layer.
inline double mixer_twin_error(const model::DecoderModel& m, const model::ForwardOptions& fo, const FamilyReference& ref) {
  const int64_t T = ref.T, H = m.spec().hidden_size;
  double worst = 0.0;
  for (int64_t l = 0; l < m.spec().num_layers; ++l) {
    std::vector<float> h(&ref.hidden[l][0], &ref.hidden[l][0] + T * H), h_ref = h;
    m.attention_block(l, h, T, fo);
    m.attention_block_ref(l, h_ref, T, fo);
    worst = std::max(worst, max_abs_diff(h.data(), h_ref.data(), T * H));
  }
  return worst;
}

// The next tokens of one sequence through every layer's mixer decode (Mixer::decode: several
// positions at once when tokens has more than one) and the layers' ffn → logits [T, V].
inline std::vector<float> decode_chunk(const model::DecoderModel& m, const model::ForwardOptions& fo,
                                       const std::vector<int32_t>& tokens,
                                       std::vector<std::unique_ptr<model::MixerState>>& states) {
  const auto& s = m.spec();
  const int64_t T = static_cast<int64_t>(tokens.size()), H = s.hidden_size;
  std::vector<float> h = m.embed(tokens), x(T * H);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const model::Mixer& mixer = *m.layer(l).mixer;
    model::rmsnorm_rows(h.data(), T, H, m.layer(l).input_norm.data(), s.rms_norm_eps, x.data());
    const std::vector<float> o = mixer.decode(x.data(), T, *states.at(l), fo);
    for (int64_t i = 0; i < T * H; ++i) h[i] += o[i];
    const std::vector<float> y = m.ffn_block(l, m.moe_input(l, h, T), T, fo);
    for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
  }
  return m.logits(h, T);
}

// Prefill `prefill` tokens, then decode the rest one at a time through every layer mixer's state
// (all layers must have a family mixer); the worst logit difference against the full-sequence
// forward at the same positions.
inline double decode_error(const model::DecoderModel& m, const model::ForwardOptions& fo,
                           const std::vector<int32_t>& toks, int64_t prefill) {
  const int64_t T = static_cast<int64_t>(toks.size()), V = m.spec().vocab_size;
  const std::vector<float> full = m.forward(toks, fo);
  std::vector<std::unique_ptr<model::MixerState>> states;
  for (int64_t l = 0; l < m.spec().num_layers; ++l) states.push_back(m.layer(l).mixer->new_decode_state(T, fo));
  std::vector<float> z = decode_chunk(m, fo, {toks.begin(), toks.begin() + prefill}, states);
  double worst = max_abs_diff(z.data(), full.data(), prefill * V);
  for (int64_t t = prefill; t < T; ++t) {
    z = decode_chunk(m, fo, {toks[t]}, states);
    worst = std::max(worst, max_abs_diff(z.data(), &full[t * V], V));
  }
  for (const auto& st : states)
    if (st->pos != T) return 1e30;
  return worst;
}

// gtest parameter names from fixture names ("tiny-qwen3.5-moe" → "tiny_qwen3_5_moe").
struct FixtureName {
  template <class Info>
  std::string operator()(const Info& info) const {
    std::string n = info.param;
    for (char& c : n)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return n;
  }
};

}  // namespace moesq::test

// Host side of the MoE block (moe_block.h): which families it runs, and one layer's weights read
// through io's names for a backend (its experts via the backend's host half, experts/registry.h).
#include "runtime/layers/moe_block.h"

#include "core/error.h"
#include "core/half.h"
#include "io/tensor_names.h"
#include "model/fused_experts.h"
#include "runtime/experts/registry.h"

namespace moesq::runtime {

std::string moe_block_refusal(const io::ModelSpec& s) {
  std::string why;
  auto no = [&](bool bad, const char* what) {
    if (bad) why += (why.empty() ? "" : ", ") + std::string(what);
  };
  no(s.num_experts > 512, "it has more than 512 routed experts");
  no(s.n_group > 32, "its router has more than 32 expert groups");
  no(s.router_scoring == io::RouterScoring::TopkSoftmax && s.router_correction_bias,
     "its top-k-then-softmax router has a correction bias");
  return why;
}

namespace {

// gpt-oss's expert biases (model::load_fused_expert_biases) into HostMoe's order: per expert the gate
// bias [I], then the up bias [I] (the gate|up GEMM's columns); down [E, H] as stored.
void load_expert_biases(const io::Checkpoint& ckpt, int64_t layer, HostMoe& m) {
  const io::ModelSpec& s = ckpt.spec();
  const int64_t E = s.num_experts, I = s.moe_intermediate_size;
  std::vector<float> gu;
  model::load_fused_expert_biases(ckpt, layer, gu, m.expert_down_bias);
  m.expert_gate_up_bias.resize(E * 2 * I);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < I; ++i) {
      m.expert_gate_up_bias[e * 2 * I + i] = gu[e * 2 * I + 2 * i];
      m.expert_gate_up_bias[e * 2 * I + I + i] = gu[e * 2 * I + 2 * i + 1];
    }
}

// "{prefix}.{gate,up,down}_proj.weight" of layer `layer` (and the gate's [1, H] "{gate}" tensor) in the
// layout ops::dense_swiglu and the two GEMMs read.
HostDenseMlp load_dense_mlp(const io::Checkpoint& ckpt, int64_t layer, const std::string& prefix, int64_t I,
                            const char* gate) {
  const int64_t H = ckpt.spec().hidden_size;
  HostDenseMlp m;
  m.I = I, m.gated = gate != nullptr;
  auto append = [&](const std::string& name, const std::vector<int64_t>& shape, std::vector<uint16_t>& dst) {
    for (float f : ckpt.get_f32(io::layer_tensor(layer, name), shape)) dst.push_back(f32_to_bf16(f));
  };
  m.gate_up.reserve(static_cast<size_t>((2 * I + (m.gated ? 1 : 0)) * H));
  append(prefix + ".gate_proj.weight", {I, H}, m.gate_up);
  append(prefix + ".up_proj.weight", {I, H}, m.gate_up);
  if (gate) append(gate, {1, H}, m.gate_up);
  append(prefix + ".down_proj.weight", {H, I}, m.down);
  return m;
}

}  // namespace

HostMoe load_host_moe(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, ExpertBackend backend,
                      int64_t layer, int64_t expert_begin, int64_t expert_end) {
  const io::ModelSpec& s = ckpt.spec();
  HostMoe m;
  const std::vector<float> router = ckpt.get_f32(io::router_tensor(s, layer), {s.num_experts, s.hidden_size});
  m.router.resize(router.size());
  for (size_t i = 0; i < router.size(); ++i) m.router[i] = f32_to_bf16(router[i]);
  if (s.router_correction_bias) {
    const io::LayerTensorNames& names = io::layer_tensor_names(s.model_type);
    MOESQ_CHECK(names.router_bias, s.model_type, ": router_correction_bias without a tensor name");
    m.correction_bias = ckpt.get_f32(io::layer_tensor(layer, names.router_bias), {s.num_experts});
  }
  if (s.router_logit_bias) {
    const io::LayerTensorNames& names = io::layer_tensor_names(s.model_type);
    m.router_logit_bias = ckpt.get_f32(io::family_layer_tensor(s, layer, names.router_logit_bias, "router logit bias"),
                                       {s.num_experts});
  }
  if (s.expert_bias) load_expert_biases(ckpt, layer, m);
  if (expert_end == 0) expert_end = s.num_experts;  // (0, 0): every expert
  MOESQ_CHECK(expert_begin >= 0 && expert_begin <= expert_end && expert_end <= s.num_experts, ckpt.dir(), " layer ",
              layer, ": experts [", expert_begin, ", ", expert_end, ") outside the ", s.num_experts, " routed experts");
  m.experts = expert_backend_host(backend).load(ckpt, q, layer, expert_begin, expert_end);
  if (s.num_shared_experts > 0) {
    const io::LayerTensorNames& names = io::layer_tensor_names(s.model_type);
    MOESQ_CHECK(names.shared_expert, s.model_type, ": shared experts without a tensor name");
    MOESQ_CHECK(!s.shared_expert_gate || names.shared_expert_gate, s.model_type,
                ": a shared-expert gate without a tensor name");
    m.mlp = load_dense_mlp(ckpt, layer, names.shared_expert, s.shared_expert_intermediate_size,
                           s.shared_expert_gate ? names.shared_expert_gate : nullptr);
  }
  return m;
}

HostMoe load_host_dense_layer(const io::Checkpoint& ckpt, int64_t layer) {
  HostMoe m;
  m.mlp = load_dense_mlp(ckpt, layer, "mlp", ckpt.spec().intermediate_size, nullptr);
  return m;
}

}  // namespace moesq::runtime

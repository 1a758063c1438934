// Host half of the bf16 expert backend (bf16.h): runs every stored layout, on its exact bf16 products.
#include "runtime/experts/bf16.h"

#include "core/error.h"
#include "core/half.h"
#include "format/kernel_layout.h"
#include "io/import_checkpoint.h"
#include "io/tensor_names.h"
#include "model/fused_experts.h"
#include "runtime/experts/registry.h"

namespace moesq::runtime {

void permute_dense_rows(const float* w, int64_t N, int64_t K, int64_t K_pad, uint16_t* out) {
  for (int64_t n = 0; n < N; ++n) {
    uint16_t* o = out + n * K_pad;
    for (int64_t k = 0; k < K_pad; ++k) o[k] = 0;
    for (int64_t k = 0; k < K; ++k) o[format::act_storage_index(k, format::ActLayout::kKMajor)] = f32_to_bf16(w[n * K + k]);
  }
}

namespace {

class Bf16Host final : public ExpertBackendHost {
 public:
  std::string refuses(io::ExpertStorage) const override { return ""; }
  io::ExpertStorage native_storage() const override { return io::ExpertStorage::Dense; }
  std::unique_ptr<HostExperts> load(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, int64_t l,
                                    int64_t begin, int64_t end) const override {
    const io::ModelSpec& s = ckpt.spec();
    const int64_t H = s.hidden_size, I = s.moe_intermediate_size;
    const int64_t H_pad = format::padded_k(H), I_pad = format::padded_k(I), n = end - begin;
    auto out = std::make_unique<Bf16HostExperts>();
    out->begin = begin, out->end = end;
    out->gu.assign(n * 2 * I * H_pad, 0);
    out->down.assign(n * H * I_pad, 0);
    auto put = [&](int64_t i, const float* g, const float* u, const float* d) {  // expert begin + i
      permute_dense_rows(g, I, H, H_pad, &out->gu[(i * 2 * I) * H_pad]);
      permute_dense_rows(u, I, H, H_pad, &out->gu[(i * 2 * I + I) * H_pad]);
      permute_dense_rows(d, H, I, I_pad, &out->down[i * H * I_pad]);
    };
    if (io::layer_tensor_names(s.model_type).fused_gate_up) {  // gpt-oss: fused (or per-expert) tensors
      const std::vector<model::ExpertWeights> w = model::load_moe_layer_experts(ckpt, q, l);
      for (int64_t i = 0; i < n; ++i) put(i, w[begin + i].gate.data(), w[begin + i].up.data(), w[begin + i].down.data());
      return out;
    }
    for (int64_t i = 0; i < n; ++i) {
      auto read = [&](io::ExpertProj p, int64_t N, int64_t K) {
        // Any layout io reads, dequantized exactly (.weight, NVFP4, INT4).
        return io::read_expert_weight_f32(ckpt, q, io::expert_tensor_prefix(s, l, begin + i, p), N, K);
      };
      const std::vector<float> g = read(io::ExpertProj::Gate, I, H);
      const std::vector<float> u = read(io::ExpertProj::Up, I, H);
      const std::vector<float> d = read(io::ExpertProj::Down, H, I);
      put(i, g.data(), u.data(), d.data());
    }
    return out;
  }
};

}  // namespace

const ExpertBackendHost& bf16_host() {
  static const Bf16Host b;
  return b;
}

}  // namespace moesq::runtime

// Host half of the paired 4:8 expert backends (paired_sparse.h): every layout io reads as paired 4:8
// (moesq, compressed-tensors NVFP4 whose data is paired, pair-bitmask) gives the canonical
// Sparse48Tensor (io::read_packed_weight), so every layout uploads the same bytes.
#include "runtime/experts/paired_sparse.h"

#include "core/error.h"
#include "format/nvfp4.h"
#include "format/packed_weight.h"
#include "io/import_checkpoint.h"
#include "io/tensor_names.h"
#include "runtime/experts/registry.h"

namespace moesq::runtime {

namespace {

// One projection as paired 4:8 NVFP4. Error naming the tensor for a dense-NVFP4 projection.
format::Sparse48Tensor read_sparse48(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, const std::string& p,
                                     int64_t N, int64_t K) {
  MOESQ_CHECK(io::has_packed_projection(ckpt, p), "tensor ", p, io::kWeightPacked, " not found in ", ckpt.dir(),
              " (a paired-4:8 backend needs a paired-4:8-nvfp4 checkpoint)");
  format::PackedWeight w = io::read_packed_weight(ckpt, q, p, N, K);
  MOESQ_CHECK(w.is_sparse48(), "tensor ", p, " in ", ckpt.dir(), " is dense NVFP4, not paired 4:8: the paired-4:8 "
              "backends need every projection paired (use --experts bf16)");
  return *w.sparse48();  // γ already checked by io's global-scale readers (check_stored_tensor_scale)
}

// gate [I, H] and up [I, H] → one [2I, H] tensor (gate rows first) carrying the gate's γ; the up's γ
// (equal for moesq checkpoints, its own in the reference's) goes to KernelWeights::gamma_hi.
format::Sparse48Tensor fuse_rows(const format::Sparse48Tensor& g, const format::Sparse48Tensor& u) {
  format::Sparse48Tensor f = g;
  f.N = g.N + u.N;
  f.values.insert(f.values.end(), u.values.begin(), u.values.end());
  f.meta.insert(f.meta.end(), u.meta.begin(), u.meta.end());
  f.scales.insert(f.scales.end(), u.scales.begin(), u.scales.end());
  return f;
}

class PairedSparseHost final : public ExpertBackendHost {
 public:
  PairedSparseHost(ExpertBackend id, bool act_quant) : id_(id), act_quant_(act_quant) {}

  std::string refuses(io::ExpertStorage storage) const override {
    if (storage == io::ExpertStorage::Sparse48) return "";
    return std::string("expert backend ") + expert_backend_name(id_) +
           " needs a paired-4:8-nvfp4 checkpoint (moesq compress ...); this one has " +
           io::expert_storage_name(storage) + " experts (use --experts bf16)";
  }
  io::ExpertStorage native_storage() const override { return io::ExpertStorage::Sparse48; }
  bool act_quant() const override { return act_quant_; }
  int act_block() const override { return act_quant_ ? format::kSparseScaleBlock : 0; }

  std::unique_ptr<HostExperts> load(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, int64_t l,
                                    int64_t begin, int64_t end) const override {
    const io::ModelSpec& s = ckpt.spec();
    const int64_t H = s.hidden_size, E = s.num_experts, I = s.moe_intermediate_size;
    const int64_t n = end - begin;
    MOESQ_CHECK(n > 0, ckpt.dir(), " layer ", l, ": an empty expert shard [", begin, ", ", end, ")");
    std::vector<format::Sparse48Tensor> gu(n), down(n);
    std::vector<const format::Sparse48Tensor*> pgu(n), pdown(n);
    std::vector<float> gamma_up(n);
    bool separate = false;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = begin + i;
      const std::string gate = io::expert_tensor_prefix(s, l, e, io::ExpertProj::Gate);
      const std::string up = io::expert_tensor_prefix(s, l, e, io::ExpertProj::Up);
      const format::Sparse48Tensor ug = read_sparse48(ckpt, q, up, I, H);
      gu[i] = fuse_rows(read_sparse48(ckpt, q, gate, I, H), ug);
      gamma_up[i] = ug.global_scale;
      separate = separate || ug.global_scale != gu[i].global_scale;
      down[i] = read_sparse48(ckpt, q, io::expert_tensor_prefix(s, l, e, io::ExpertProj::Down), H, I);
      pgu[i] = &gu[i];
      pdown[i] = &down[i];
    }
    auto out = std::make_unique<PairedSparseHostExperts>();
    out->begin = begin, out->end = end;
    const std::string where = ckpt.dir() + " layer " + std::to_string(l);
    out->gu = format::kernel_layout_from_sparse48(pgu, where + " gate|up experts");
    if (separate) {  // the reference's layout: gate and up each with its own γ
      MOESQ_CHECK(I % 16 == 0, where, ": moe_intermediate_size ", I, " is not a multiple of 16, which separate gate/up ",
                  "global scales need on the GPU");
      out->gu.gamma_hi = std::move(gamma_up);
      out->gu.m_split = I;
    }
    out->down = format::kernel_layout_from_sparse48(pdown, where + " down experts");
    if (act_quant_ && q.act_static && q.act_quant) {
      out->act_gamma_gu.resize(E);
      out->act_gamma_down.resize(E);
      for (int64_t e = 0; e < E; ++e) {
        const io::StaticActScales a = io::read_static_act_scales(ckpt, q, l, e);
        MOESQ_CHECK(a.gate_up > 0.0f && a.down > 0.0f, where, " expert ", e, ": no static input_global_scale (",
                    "config.json says input_activations.dynamic false)");
        out->act_gamma_gu[e] = a.gate_up;
        out->act_gamma_down[e] = a.down;
      }
    }
    return out;
  }

 private:
  ExpertBackend id_;
  bool act_quant_;
};

}  // namespace

const ExpertBackendHost& sparse_w4a4_host() {
  static const PairedSparseHost b(ExpertBackend::kSparseW4A4, true);
  return b;
}

const ExpertBackendHost& sparse_w4a16_host() {
  static const PairedSparseHost b(ExpertBackend::kSparseW4A16, false);
  return b;
}

}  // namespace moesq::runtime

// Host side of the GPU engine's weights: a qwen3_moe checkpoint in any layout the CPU loader reads
// (bf16 original; moesq paired 4:8 or dense NVFP4; compressed-tensors NVFP4, pair-bitmask or
// pack-quantized INT4: docs/FORMAT.md §7–§10), read through io (read_quantization_config,
// read_packed_weight, read_expert_weight_f32) and put into the layouts the engine's kernels read, ONCE,
// before upload. A paired export uploads the same bytes as its canonical moesq original
// (tests/runtime/test_weights_layouts.cpp). No CUDA here, so it is tested on the CPU.
//
// Non-obvious decisions: q|k|v are fused into one [(nh + 2·nkv)·hd, H] projection (one GEMM, one
// head-norm/RoPE pass); gate|up into one [2I, K] expert projection (gate rows first, as
// ops::swiglu_quant expects), which for paired 4:8 needs ONE global scale for both (FORMAT.md: moesq
// writes it so; anything else is an error, never a silently wrong up projection). Dense bf16 experts
// get their K columns permuted into the activation layout kKMajor, so the dispatch's permuted rows
// need no un-permutation (a dot product does not care about the order of its terms).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"
#include "format/kernel_layout.h"
#include "runtime/backend.h"

namespace moesq::runtime {

struct HostLayer {
  std::vector<float> input_norm, post_norm;  // [H]
  std::vector<float> q_norm, k_norm;         // [hd]
  std::vector<uint16_t> qkv;                 // [(nh + 2·nkv)·hd, H] bf16
  std::vector<uint16_t> o;                   // [H, nh·hd] bf16
  std::vector<uint16_t> router;              // [E, H] bf16
  std::vector<uint16_t> gu_dense;            // bf16 backend: [E, 2I, H_pad], K in kKMajor order, 0 past H
  std::vector<uint16_t> down_dense;          // bf16 backend: [E, H, I_pad], K in kKMajor order, 0 past I
  format::KernelWeights gu_sparse, down_sparse; // sparse backends: gate|up [E, 2I, H], down [E, H, I]
};

struct HostModel {
  io::ModelSpec spec;
  ExpertBackend backend = ExpertBackend::kBf16;  // resolved (never kAuto)
  std::string expert_format = "bf16";            // of the checkpoint: bf16 | paired-4:8-nvfp4 | nvfp4 | int4
  bool act_quant = false;                        // NVFP4 expert activations (sparse-w4a4)
  int act_block = 0;                             // 32 when act_quant
  std::vector<uint16_t> embed;                   // [V, H] bf16
  std::vector<float> final_norm;                 // [H]
  std::vector<uint16_t> lm_head;                 // [V, H] bf16
  std::vector<HostLayer> layers;
};

// One MoE layer's router and routed experts (the HostLayer fields runtime::moe_block reads: router and
// gu_*/down_* of `backend`; the others stay empty), for runtime::MoeLayerGpu (Python moesq.MoeLayer).
struct HostMoeLayer {
  io::ModelSpec spec;
  int64_t layer = 0;
  ExpertBackend backend = ExpertBackend::kBf16;  // resolved (never kAuto)
  std::string expert_format = "bf16";
  bool act_quant = false;                        // sparse-w4a4: NVFP4 activations
  HostLayer weights;
};

// The backend a checkpoint of `expert_format` runs with when `requested` (kAuto → the format's own:
// paired → sparse-w4a4, nvfp4 → nvfp4-w4a16, bf16 and int4 → bf16 on the exact bf16 products).
// Errors: a backend that is not built (naming those that are), sparse on a dense checkpoint.
ExpertBackend resolve_backend(ExpertBackend requested, const std::string& expert_format);

// Reads and converts everything. Errors name the tensor and the directory (dense MLP layers and
// non-qwen3_moe checkpoints are refused by name).
HostModel load_host_model(const io::Checkpoint& ckpt, ExpertBackend requested);

// Reads layer `layer`'s router and experts as load_host_model does. Errors: as load_host_model, and a
// layer out of range or a dense MLP layer (naming the directory and the layer).
HostMoeLayer load_host_moe_layer(const io::Checkpoint& ckpt, int64_t layer, ExpertBackend requested);

// The shapes of a named model ("qwen3-30b-a3b", "qwen3-235b-a22b") with `layers` decoder layers
// (0: all). Error names --synthetic and the known names.
io::ModelSpec synthetic_spec(const std::string& name, int64_t layers);

// Dense [N, K] fp32 rows → [N, K_pad] bf16 with column k stored at act_storage_index(k, kKMajor).
void permute_dense_rows(const float* w, int64_t N, int64_t K, int64_t K_pad, uint16_t* out);

}  // namespace moesq::runtime

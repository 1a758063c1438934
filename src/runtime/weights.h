// Host side of the GPU engine's weights: a checkpoint of a GPU-supported family (supports: each of its
// blocks runs it) in any layout the CPU loader reads (bf16 original; moesq paired 4:8 or dense NVFP4;
// compressed-tensors NVFP4, pair-bitmask or pack-quantized INT4: docs/FORMAT.md §7–§10), read through
// io (tensor names of io/tensor_names.h, io::read_quantization_config, the expert backend's host half)
// and put into the layouts the engine's kernels read, ONCE, before upload. A paired export uploads the
// same bytes as its canonical moesq original (tests/runtime/test_weights_layouts.cpp). No CUDA here,
// so it is tested on the CPU.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "io/config.h"
#include "model/rope.h"
#include "runtime/backend.h"
#include "runtime/layers/attention_block.h"
#include "runtime/layers/gdn_block.h"
#include "runtime/layers/mla_block.h"
#include "runtime/layers/moe_block.h"

namespace moesq::runtime {

// One decoder layer: h += mixer(input_norm(h)); h += moe(post_norm(h)). The mixer is the GQA block
// (attn), or for a spec with MLA (spec.mla.kv_lora_rank > 0) the MLA block (mla), or on a hybrid
// family's linear_attention layer (is_gdn) the Gated DeltaNet block (gdn).
struct HostLayer {
  HostAttention attn;
  HostMla mla;
  HostGdn gdn;
  bool is_gdn = false;
  std::vector<float> post_norm;  // [H]
  HostMoe moe;
};

struct HostModel {
  io::ModelSpec spec;
  ExpertBackend backend = ExpertBackend::kBf16;                // resolved (never kAuto)
  io::ExpertStorage expert_storage = io::ExpertStorage::Dense;  // of the checkpoint
  bool act_quant = false;                                      // NVFP4 expert activations (sparse-w4a4)
  int act_block = 0;                                           // 32 when act_quant
  std::vector<uint16_t> embed;                                 // [V, H] bf16
  std::vector<float> final_norm;                               // [H]
  std::vector<uint16_t> lm_head;                               // [V, H] bf16
  std::vector<HostLayer> layers;
  // The RoPE of the GQA attention layers: the family config's (gpt-oss: YaRN; the hybrid families:
  // partial, over rotary_dim; model::rope_frequencies of io::FamilySpec::rope); empty inv_freq: default
  // RoPE (rope_theta over head_dim).
  model::RopeFrequencies rope;
  GdnBlockDims gdn;  // the hybrid families' Gated DeltaNet shapes (all 0 without linear_attention layers)
};

// One MoE layer's router and routed experts, for runtime::MoeLayerGpu (Python moesq.MoeLayer).
struct HostMoeLayer {
  io::ModelSpec spec;
  int64_t layer = 0;
  ExpertBackend backend = ExpertBackend::kBf16;  // resolved (never kAuto)
  io::ExpertStorage expert_storage = io::ExpertStorage::Dense;
  bool act_quant = false;                        // sparse-w4a4: NVFP4 activations
  HostMoe weights;
};

// Whether the GPU engine runs `spec`'s family: each of its blocks (layers/attention_block.h,
// layers/moe_block.h) does. gpu_refusal: "" when it does, else what is missing, block by block.
bool supports(const io::ModelSpec& spec);
std::string gpu_refusal(const io::ModelSpec& spec);

// The backend a checkpoint whose experts are stored as `storage` runs with when `requested` (kAuto →
// the storage's own: paired 4:8 → sparse-w4a4, dense NVFP4 → nvfp4-w4a16, bf16 and INT4 → bf16 on the
// exact bf16 products). Errors: a backend that is not built (naming those that are), one that refuses
// the storage (sparse on a dense checkpoint).
ExpertBackend resolve_backend(ExpertBackend requested, io::ExpertStorage storage);

// What the checkpoint's routed experts are stored as (io::read_quantization_config; a compressed-tensors
// NVFP4 file says whether it is paired only through its data: the first MoE layer's expert 0 gate
// projection decides, and the paired backends refuse any projection that disagrees). A half-compressed
// checkpoint is refused as the CPU loader refuses it (io::check_expert_storage).
io::ExpertStorage checkpoint_expert_storage(const io::Checkpoint& ckpt, const io::QuantizationConfig& q);

// Reads and converts everything (a dense MLP layer: its MLP alone, load_host_dense_layer); of the routed
// experts only [expert_begin, expert_end) of each MoE layer ((0, 0): all; an expert-parallel rank reads
// its shard, EngineOptions::expert_begin). Errors name the tensor and the directory (a family that is
// not supported, naming what is missing), a shard outside the experts.
HostModel load_host_model(const io::Checkpoint& ckpt, ExpertBackend requested, int64_t expert_begin = 0,
                          int64_t expert_end = 0);

// Reads layer `layer`'s router, experts and shared expert as load_host_model does; only the MoE block
// must run the family (its attention may be one the engine does not run: DeepSeek-V3's MLA).
// Errors: as load_host_model, and a layer out of range or a dense MLP layer (naming the directory
// and the layer).
HostMoeLayer load_host_moe_layer(const io::Checkpoint& ckpt, int64_t layer, ExpertBackend requested);

// The shapes of a named model ("qwen3-30b-a3b", "qwen3-235b-a22b", "kimi-k2.5", "qwen3-next-80b-a3b",
// "qwen3.5-397b-a17b") with
// `layers` decoder layers (0: all). Error names --synthetic and the known names.
io::ModelSpec synthetic_spec(const std::string& name, int64_t layers);

// The same model's shapes as the engine's synthetic constructor takes them: synthetic_spec, and for a
// hybrid (qwen3-next-80b-a3b, qwen3.5-397b-a17b: the public config parsed by io::parse_family_config) the RoPE over
// the rotated dims, the Gated DeltaNet dims, each layer's kind and its attention's gate and rotary dims.
// No weights (every weight vector is empty).
HostModel synthetic_model(const std::string& name, int64_t layers);

// Whether synthetic_spec(name) is a hybrid (Gated DeltaNet) model: the GPU engine runs it, the synthetic
// CPU model of `bench compress` does not.
bool synthetic_is_hybrid(const std::string& name);

}  // namespace moesq::runtime

// The GPU engine on one GPU, for a family whose blocks it runs (weights.h supports: qwen3_moe, mixtral,
// olmoe, qwen2_moe; deepseek_v3 and kimi_k2 through the MLA block, layers/mla_block.h, whose cache is
// the latent row per token instead of K/V per kv head):
// weights uploaded once, batched prefill and KV-cached decode over fixed sequence slots, expert backends
// from runtime/experts/ (registry.h), decode steps replayed from CUDA graphs. Plain C++ interface (the
// CUDA state lives in engine.cu behind Impl).
//
// Per layer: RMSNorm → fused q|k|v GEMM → q/k head norm + RoPE + KV append → causal GQA attention
// → o_proj (+= residual) → RMSNorm → router GEMM (fp32 logits) → softmax/top-k/renorm → dispatch
// (+ NVFP4 act quant) → gate|up grouped GEMM → SwiGLU (+ requant) → down grouped GEMM → combine in
// ascending expert order (+= residual). Residual stream fp32; non-expert GEMM inputs bf16 hi + lo
// pairs (near fp32); expert GEMM inputs bf16 (W4A16) or NVFP4 (W4A4, quantized from the hi + lo
// row); gate|up output fp32 into SwiGLU (+ requant from fp32); KV cache bf16.
//
// KV cache: paged (runtime/kv_blocks.h, ops/attention/kv_layout.h): blocks of 64 tokens from one pool,
// taken as a slot grows and returned by reset(slot), so sequences of any length share the memory;
// which blocks a sequence got never changes its bits.
//
// Deterministic (default; EngineOptions::deterministic): every GEMM outside the experts is ops::gemm_bf16 (one
// tile config, no split-K), attention splits keys only into fixed 64-key chunks by absolute index
// (ops/attention: prefill and split-KV decode give a row the same bits), the combine has a fixed order and the sparse
// expert GEMM has no split-K, so a sequence's logits do not depend on what else is in the batch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "runtime/backend.h"
#include "runtime/layers/moe_block.h"
#include "runtime/weights.h"

namespace moesq::runtime {

constexpr int64_t kKvTokensFitMemory = -1;          // EngineOptions::kv_tokens: fill the free memory
constexpr size_t kKvReserveBytes = size_t(2) << 30;  // left free by kKvTokensFitMemory (cuBLAS, graphs)

struct EngineOptions {
  ExpertBackend experts = ExpertBackend::kAuto;
  int max_seqs = 1;          // KV-cache slots
  int64_t max_len = 0;       // tokens per slot; 0: max_position_embeddings (or 4096 when not given)
  int64_t max_tokens = 0;    // tokens per forward call (activation buffers); 0: max_seqs · max_len
  // KV-cache capacity in tokens, shared by the slots in blocks of 64 (paged KV, runtime/kv_blocks.h):
  // > 0: that many (rounded up to whole blocks; at least one sequence of max_len); 0: max_seqs ·
  // ⌈max_len/64⌉ blocks, every slot can reach max_len at once; kKvTokensFitMemory: what the device
  // memory left after weights and activations holds, less kKvReserveBytes, at most the 0 case.
  int64_t kv_tokens = 0;
  // Tokens per MoE-block call: a forward's rows go through the MoE in slices of this many (the block's
  // workspace holds capacity T per expert, E · T rows). 0 (default): the most whose workspace fits in
  // 16 GiB. Slicing never changes a bit (every op of the block is batch-invariant).
  int64_t moe_tokens = 0;
  // true (default): batch-invariant GEMMs (ops::gemm_bf16). false: the q|k|v, o_proj, router and
  // lm_head GEMMs go to cuBLAS (algorithm chosen by shape: a row's bits may depend on the batch), for
  // measuring what determinism costs. Attention and the experts are batch-invariant either way.
  bool deterministic = true;
  // Debug check for non-finite activations (runtime/finite_check.h): after the embedding, each layer's
  // attention, router logits, every expert's gate|up and down outputs and the MoE output, and the
  // logits, a small kernel records the first NaN / ±inf; forward and decode then throw NonFiniteError
  // naming the layer, stage, expert and token. false (default): no extra launch, copy or sync at all.
  bool check_finite = false;
  // Expert parallelism (docs/PARALLEL.md "The expert-parallel engine"): this rank holds and runs the
  // routed experts [expert_begin, expert_end) of every MoE layer (dist::engine_expert_range of its rank;
  // both 0: all of them, one GPU), everything else whole, and `exchange` (layers/moe_block.h) sums the
  // ranks' route-major expert outputs. Every rank must build the same model with the same options
  // (but its range) and make the same calls in the same order; a sequence's logits are then the bits
  // of one GPU. A non-capturable exchange makes decode steps run without CUDA graphs. A shard needs
  // deterministic mode and a fixed kv_tokens (Error otherwise). With check_finite, a non-finite expert
  // output that does not reach h (gpt-oss's clamp can hide one) is reported by its own rank alone: the
  // caller must then end every rank (the CLI does: dist::run_or_abort_all).
  int64_t expert_begin = 0, expert_end = 0;
  ExpertExchange exchange;
  // Gated DeltaNet layers (Qwen3-Next, Qwen3.5): false (default): a prefill takes the ops' parallel
  // form (ops/gated_deltanet: every token's conv, norms and gates at once, S walked in 32-column
  // blocks); true: the decode walk. The SAME bits either way; for measuring one against the other.
  bool gdn_walk_prefill = false;
};

// A run of new tokens for one slot, appended at the slot's current length.
struct SeqChunk {
  int slot = 0;
  std::vector<int32_t> tokens;
};

class Engine {
 public:
  Engine(const io::Checkpoint& ckpt, const EngineOptions& opt);
  Engine(HostModel host, const EngineOptions& opt);
  // A synthetic model of `spec`'s exact shapes with weights drawn on the GPU from `seed`
  // (ops/synth_pack: uniform bf16 noise, paired 4:8 experts drawn in the packed domain): for
  // `moesq bench e2e --synthetic`. backend: bf16, sparse-w4a4 or sparse-w4a16.
  Engine(const io::ModelSpec& spec, ExpertBackend backend, uint64_t seed, const EngineOptions& opt);
  // The same from runtime::synthetic_model's shapes (a hybrid's layer kinds, Gated DeltaNet dims and
  // partial RoPE as well; weights ignored).
  Engine(const HostModel& shapes, ExpertBackend backend, uint64_t seed, const EngineOptions& opt);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const io::ModelSpec& spec() const;
  ExpertBackend backend() const;
  io::ExpertStorage expert_storage() const;  // of the checkpoint (synthetic: of the backend)
  const char* expert_format() const;         // io::expert_storage_name(expert_storage())
  bool act_quant() const;
  int act_block() const;
  int max_seqs() const;
  int64_t max_len() const;
  int64_t max_tokens() const;  // tokens one forward may carry (EngineOptions::max_tokens as resolved)

  // Appends each chunk to its slot; returns fp32 logits [Σ tokens, V] (all_logits) or [chunks, V]
  // (the last token of each chunk). Errors: a slot out of range or past max_len, > max_tokens;
  // KvCacheFull (runtime/kv_blocks.h) when the free KV blocks do not hold the new tokens (nothing
  // ran, nothing changed); with check_finite, NonFiniteError (the slots' lengths then stay as they were).
  std::vector<float> forward(const std::vector<SeqChunk>& chunks, bool all_logits);
  // One token for each of `slots` (any B = slots.size() distinct live slots, in any order), appended
  // at each slot's current length; returns logits [B, V], row b for slots[b]. Replayed from a CUDA
  // graph captured per B on first use: the slot list, positions and tokens are device data the graph
  // reads, so one graph serves every set of B slots (and the block table: a device array too).
  // Errors: B outside [1, min(max_seqs, max_tokens)], slots.size() != tokens.size(), a slot out of
  // range, repeated or full, a token outside [0, V); KvCacheFull as forward's; with check_finite,
  // NonFiniteError.
  std::vector<float> decode(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens);
  // The same step returning only the greedy next token of each row (argmax on the GPU, lowest id on
  // ties), so a benchmark step does not copy B·V logits to the host.
  std::vector<int32_t> decode_greedy(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens);
  // The slots {0, …, B−1} case (B = tokens.size()).
  std::vector<float> decode(const std::vector<int32_t>& tokens);
  std::vector<int32_t> decode_greedy(const std::vector<int32_t>& tokens);
  // Switches the mode of EngineOptions::deterministic (drops the captured decode graphs).
  void set_deterministic(bool on);
  bool deterministic() const;
  // Switches EngineOptions::check_finite (drops the captured decode graphs).
  void set_check_finite(bool on);
  bool check_finite() const;
  void reset();                     // every slot empty, every KV block free
  void reset(int slot);             // this slot empty, its KV blocks free (a new sequence can be prefilled into it)
  int64_t length(int slot) const;   // tokens in the slot

  size_t weight_bytes() const;  // device bytes of all weights
  size_t kv_bytes() const;      // device bytes of the KV cache
  int64_t kv_blocks() const;     // KV blocks of 64 tokens in the cache (EngineOptions::kv_tokens resolved)
  int64_t kv_free_blocks() const;  // of those, held by no slot
  // Milliseconds of the last forward/decode spent in attention (qk_rope + attention kernels) and in
  // the MoE part (router to combine), measured with events when timing is on (it syncs per layer).
  void set_timing(bool on);
  double last_attention_ms() const;
  double last_moe_ms() const;

 private:
  void decode_step(const std::vector<int32_t>& slots, const std::vector<int32_t>& tokens, std::vector<float>* logits,
                   std::vector<int32_t>* next);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesq::runtime

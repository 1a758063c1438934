// The routing's input on the GPU (compress --device cuda; LayerDevice::moe_inputs): a layer's
// attention block over every calibration sequence in fp32, then the post-attention RMSNorm — what
// layer_moe_inputs computes with model::DecoderModel::attention_block and moe_input on the CPU:
//   rmsnorm (ops/rmsnorm, fp32 out) → q|k|v GEMM (one fused weight) → q/k head norm + RoPE
//   (ops/qk_rope with fp32 k/v rows, the CPU's RoPE tables) → causal GQA attention
//   (ops/causal_attention_f32) → o_proj GEMM accumulated into h → rmsnorm (post) → X; both GEMMs
//   3xTF32 (gpu::sgemm_3xtf32: fp32-class accuracy on tensor cores).
// Multi-head latent attention layers (DeepSeek-V3 / Kimi-K2: L.mixer a model::MlaMixer) take
// mla_rows_cuda instead: model::mla_forward's naive form in fp32 (compress/mla_cuda.cu).
// Sequences go in chunks of whole sequences (≈ kChunkRows rows), so device memory is bounded for any
// calibration size. Values differ from the CPU's by fp32 summation order (GEMMs, the online softmax)
// and expf's ulps. Defined in CUDA builds only (moesq_compress_cuda).
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "model/decoder.h"
#include "model/mixers/mla_mixer.h"

namespace moesq::compress {

// The same on device memory: dh [n, H] fp32 rows of the sequences packed row after row (offset [S + 1]:
// the first row of each, offset[S] = n), updated in place; dX [n, H] receives X. Launched on the calling
// thread's stream (compress/cuda_context.cuh), not waited for.
void attention_rows_cuda(const io::ModelSpec& spec, const model::LayerWeights& L, float* dh, float* dX,
                         const std::vector<int64_t>& offset);

// The rows of sequences [a, b) of one pass (offset [S + 1]: each sequence's first row, packed): pos [n]
// each row's position in its sequence, start [n] the chunk-local first row of its sequence (n =
// offset[b] − offset[a]); shared by attention_rows_cuda and mla_rows_cuda.
void chunk_rows(const std::vector<int64_t>& offset, size_t a, size_t b, std::vector<int32_t>& pos,
                std::vector<int64_t>& start);

// attention_rows_cuda for an MLA layer: rmsnorm (fp32) → [q_a | q_proj] GEMM → q_a RMSNorm (eps 1e-6) →
// q_b GEMM; kv_a GEMM → ops::mla_split_rope_f32 (latent c, rotated k_pe and q rope dims) → latent
// RMSNorm → kv_b GEMM → ops::mla_expand_kv_f32 (per-head keys [k_nope | k_pe], values) →
// ops::causal_attention_f32 (d_qk keys, d_v values, the mixer's softmax scale) → o_proj GEMM
// accumulated into h → rmsnorm (post) → X; GEMMs 3xTF32. The mixer's own RoPE tables (default or YaRN).
// Requires gpu_attention_refusal(spec, L) empty (no MLA biases, head dims ≤ 256).
void mla_rows_cuda(const io::ModelSpec& spec, const model::MlaMixer& mla, const model::LayerWeights& L, float* dh,
                   float* dX, const std::vector<int64_t>& offset);

// h: [S] sequences of [T_i, H] fp32, updated in place (h += attention(input_norm(h))); returns
// X = post_attention_layernorm(h) [Σ T_i, H] in sequence order. The layer must pass
// gpu_attention_refusal (pipeline.h). Errors: CUDA / cuBLAS failures naming the call.
std::vector<float> moe_inputs_cuda(const io::ModelSpec& spec, const model::LayerWeights& L,
                                   std::vector<std::vector<float>>& h);

}  // namespace moesq::compress

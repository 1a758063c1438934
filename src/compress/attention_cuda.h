// The routing's input on the GPU (compress --device cuda; LayerDevice::moe_inputs): a layer's
// attention block over every calibration sequence in fp32, then the post-attention RMSNorm — what
// layer_moe_inputs computes with model::DecoderModel::attention_block and moe_input on the CPU:
//   rmsnorm (ops/rmsnorm, fp32 out) → q|k|v GEMM (one fused weight) → q/k head norm + RoPE
//   (ops/qk_rope with fp32 k/v rows, the CPU's RoPE tables) → causal GQA attention
//   (ops/causal_attention_f32) → o_proj GEMM accumulated into h → rmsnorm (post) → X; both GEMMs
//   3xTF32 (gpu::sgemm_3xtf32: fp32-class accuracy on tensor cores).
// Sequences go in chunks of whole sequences (≈ kChunkRows rows), so device memory is bounded for any
// calibration size. Values differ from the CPU's by fp32 summation order (GEMMs, the online softmax)
// and expf's ulps. Defined in CUDA builds only (moesq_compress_cuda).
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "model/decoder.h"

namespace moesq::compress {

// The same on device memory: dh [n, H] fp32 rows of the sequences packed row after row (offset [S + 1]:
// the first row of each, offset[S] = n), updated in place; dX [n, H] receives X. Launched on the calling
// thread's stream (compress/cuda_context.cuh), not waited for.
void attention_rows_cuda(const io::ModelSpec& spec, const model::LayerWeights& L, float* dh, float* dX,
                         const std::vector<int64_t>& offset);

// h: [S] sequences of [T_i, H] fp32, updated in place (h += attention(input_norm(h))); returns
// X = post_attention_layernorm(h) [Σ T_i, H] in sequence order. The layer must pass
// gpu_attention_refusal (pipeline.h). Errors: CUDA / cuBLAS failures naming the call.
std::vector<float> moe_inputs_cuda(const io::ModelSpec& spec, const model::LayerWeights& L,
                                   std::vector<std::vector<float>>& h);

}  // namespace moesq::compress

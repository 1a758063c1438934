// Expert backends of the GPU engine: which kernels run the routed experts. Names are the CLI's
// (`--experts`); the set that is BUILT is listed in every error about one that is not.
#pragma once
#include <string>
#include <vector>

namespace moesq::runtime {

enum class ExpertBackend {
  kAuto,         // what the checkpoint holds: bf16 → bf16, paired 4:8 → sparse-w4a4, nvfp4 → nvfp4-w4a16
  kBf16,         // dense bf16 grouped GEMM (ops::gemm_bf16; experts/bf16); compressed experts are dequantized to bf16
  kSparseW4A4,   // paired 4:8 NVFP4 weights, NVFP4 activations (ops::sparse_gemm; experts/paired_sparse)
  kSparseW4A16,  // paired 4:8 NVFP4 weights, bf16 activations (same kernel)
  kAwqW4A16,     // not built in the engine yet
  kNvfp4W4A16,   // not built in the engine yet
};

ExpertBackend parse_expert_backend(const std::string& s);  // Error names --experts and every name
const char* expert_backend_name(ExpertBackend b);
// Which are built: the rows of experts/registry.h (defined in experts/registry.cpp).
bool expert_backend_built(ExpertBackend b);
std::string built_expert_backends();  // "bf16, sparse-w4a4, sparse-w4a16"
// Error unless built, naming the backends that are.
void require_built(ExpertBackend b);

}  // namespace moesq::runtime

// Paper Algorithm 1, layer by layer: route the calibration states once, cache each expert's inputs
// X_e and router weights g_e (and the dense targets Y_e), compress the experts of the layer in
// parallel, then propagate H_{l+1} = Block_l(H_l) through the COMPRESSED layer (W4A4 as deployed),
// so later layers calibrate on the inputs they will really see.
// Over several processes (docs/PARALLEL.md), each rank compresses its share of every layer's
// experts (dist/partition.h); the shares are exchanged and placed in expert order, and every rank
// computes the next layer's inputs itself, so the result is the same bits whatever the rank count.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compress/calib.h"
#include "compress/jsq.h"
#include "compress/method.h"
#include "compress/obr.h"
#include "compress/packed_expert.h"
#include "compress/refine/options.h"
#include "compress/sgptq.h"
#include "model/decoder.h"

namespace moesq::dist {
class Communicator;
}

namespace moesq::compress {

class WorkDir;

// Where an expert's SGPTQ and refinement run (methods sgptq and moesq; routing, the targets and the
// propagation run on the CPU so far). kCuda goes with SgptqOptions::device = sgptq_expert_cuda
// (compress/sgptq_cuda.h) and RefineOptions::device = refine::make_cuda_step_backend.
enum class Device { kCpu, kCuda };
const char* device_name(Device d);  // "cpu", "cuda"
// True for the methods with a GPU solver (sgptq, moesq).
bool gpu_method(const Method& m);

struct ExpertCalib;

// The GPU half of an expert's task around its solver (compress --device cuda; compress/expert_cuda.h):
// its rows uploaded and its targets computed once, and its W4A4 error measured where they are.
struct ExpertDevice {
  // Uploads c.X and computes Y = the ORIGINAL expert (w: gate/up [I, H], down [H, I], plain SwiGLU,
  // no activation quant) on it. The pointers stay valid until the next call on the calling thread.
  DeviceRows (*rows)(const model::ExpertWeights& w, int64_t H, int64_t I, const ExpertCalib& c) = nullptr;
  // ‖Y − Ŷ‖²_F / ‖Y‖²_F over the n rows, Ŷ the W4A4 forward (activation block act_block) of the
  // dequantized weights gate/up [I, H], down [H, I] (host fp32); NaN when ‖Y‖ = 0 and Ŷ ≠ Y.
  // y_out (device [n, H], or null): receives Ŷ, the bits DeviceStates::propagate computes for these
  // rows (the same Q_a, GEMM shapes and row chunks), so the propagation adds it instead.
  double (*rel_error)(const DeviceRows& rows, int64_t n, int64_t H, int64_t I, const float* gate, const float* up,
                      const float* down, int act_block, float* y_out) = nullptr;
};

// The routes of each expert: flat route ids t·k + j grouped by expert, ascending within each (= token
// order): expert e's are ids[start[e] .. start[e + 1]). A counting sort; an expert id outside [0, E) is
// an Error naming the route. (The per-expert row cache and the GPU propagation share it.)
struct RoutesByExpert {
  std::vector<int64_t> start;  // [E + 1]
  std::vector<int64_t> ids;    // [n·k]
};
RoutesByExpert routes_by_expert(const model::Routes& r, int64_t E);

class DeviceStates;

// The GPU half of a layer's propagation H_{l+1} = H_l + MoE(H_l) (CompressOptions::layer_device;
// compress/expert_cuda.h).
struct LayerDevice {
  // The routing's input: layer L's attention block over every calibration sequence (h: [S] sequences
  // [T_i, H] fp32, updated in place) and X = post_attention_layernorm(h) [Σ T_i, H], as
  // DecoderModel::attention_block + moe_input compute it, for layers gpu_attention_refusal accepts.
  std::vector<float> (*moe_inputs)(const io::ModelSpec& spec, const model::LayerWeights& L,
                                   std::vector<std::vector<float>>& h) = nullptr;
  // The routed part of DecoderModel::moe_block with W4A4 (act_block > 0; 0 = no Q_a): y [n, H] =
  // Σ over each row's routes, in ascending expert order, of weight · expert_e(Q_a(x)), for plain
  // SwiGLU experts [E] (gate/up [I, H], down [H, I] fp32, the installed compressed ones), X [n, H] fp32
  // and routes r (n rows, top-k). Values differ from the CPU's by fp32 GEMM summation order only.
  std::vector<float> (*routed_experts)(const std::vector<model::ExpertWeights>& experts, int64_t H, int64_t I,
                                       const std::vector<float>& X, const model::Routes& r, int act_block) = nullptr;
  // The router logits [n, E] = X [n, H] · routerᵀ ([E, H]) by DeviceStates::router_logits' GEMM, so a run
  // with host states routes as a device-resident one does (the CPU's BLAS sums in another order, and
  // a sigmoid router's weights carry that difference into the next layer's inputs).
  std::vector<float> (*router_logits)(const std::vector<float>& X, int64_t n, int64_t H,
                                      const std::vector<float>& router, int64_t E) = nullptr;
  // The calibration states kept on the GPU from layer to layer (device_resident), or nullptr.
  std::unique_ptr<DeviceStates> (*make_states)() = nullptr;
};

// The calibration states H_l on the GPU for the whole run (compress --device cuda when every layer runs
// there, device_resident): the attention, the router logits, the experts' rows and the propagation
// read and write them in place, so no state crosses PCIe per layer but the router logits (and H_l for
// the work dir's hash). The same math as moe_inputs + routed_experts; one object per run, used by the
// thread that made it. Errors: CUDA / cuBLAS failures naming the call; a non-finite expert output.
class DeviceStates {
 public:
  virtual ~DeviceStates() = default;
  // H_1: [S] sequences of [T_i, H] fp32, packed row after row on the device.
  virtual void upload(const std::vector<std::vector<float>>& h, int64_t H) = 0;
  // Layer L's attention block on every sequence (h += attention(input_norm(h))), then X =
  // post_attention_layernorm(h) [n, H] on the device: returned, valid until the next call, the work
  // finished (other threads' streams may read it).
  virtual const float* attention(const io::ModelSpec& spec, const model::LayerWeights& L) = 0;
  // X · routerᵀ: the router logits [n, E] fp32 on the host (router [E, H]).
  virtual std::vector<float> router_logits(const std::vector<float>& router, int64_t E) = 0;
  // A device buffer [routes, H] fp32 for the experts' W4A4 outputs on their rows, in routes_by_expert
  // order (ExpertCalib::dev_Yq), kept from layer to layer. It is granted only when it fits in the least
  // free memory note_memory saw during the previous MoE layer (its workers' scratch held) with a tenth
  // of the GPU to spare; otherwise, and for the first MoE layer (nothing sampled yet), nullptr: the
  // propagation then recomputes every expert. Each call starts the next layer's sampling afresh.
  virtual float* expert_outputs(int64_t routes) = 0;
  // Samples the GPU's free memory (any thread): the compression workers call it after each expert,
  // while their device scratch is held, so expert_outputs knows what they need.
  virtual void note_memory() = 0;
  // h += the routed part of moe_block on X (LayerDevice::routed_experts' math) for the routes r. kept
  // ([E] or empty): kept[e] = 1 when expert e's outputs are already in expert_outputs' buffer (its
  // error stage wrote them); those are added as they are, the others computed here — the same bits.
  // shared (or nullptr): an ungated shared expert (gate/up [shared_I, H], down [H, shared_I]) added to
  // the routed sum before the residual, as moe_block and the host-state path add it (plain_mlp_on_device's
  // row chunks, so the same GEMM shapes).
  virtual void propagate(const std::vector<model::ExpertWeights>& experts, int64_t I, const model::Routes& r,
                         int act_block, const std::vector<uint8_t>& kept, const model::ExpertWeights* shared = nullptr,
                         int64_t shared_I = 0) = 0;
  // h += a dense MLP layer's plain SwiGLU on X (W: gate/up [I, H], down [H, I]; no Q_a), in
  // plain_mlp_on_device's row chunks (the host-state path's GEMM shapes).
  virtual void propagate_mlp(const model::ExpertWeights& W, int64_t I) = 0;
  // H_l to the host, in upload's shape.
  virtual void download(std::vector<std::vector<float>>& h) = 0;
};

// A plain SwiGLU MLP (a dense layer's, or a shared expert without a gate) on the GPU through
// dev.routed_experts: every row of X [n, H] routed to the one expert W (gate/up [I, H], down [H, I]) with
// weight 1 and no Q_a (act_block 0), in chunks of at most max_rows rows (0: as many as keep the device's
// [rows, 2·I] intermediate near 2 GiB), in row order. Returns y [n, H] — model::DecoderModel::dense_mlp /
// shared_expert_forward's values up to fp32 GEMM summation order (× 1 is exact). Errors: dev's.
std::vector<float> plain_mlp_on_device(const LayerDevice& dev, const model::ExpertWeights& W, int64_t H, int64_t I,
                                       const std::vector<float>& X, int64_t n, int64_t max_rows = 0);
// plain_mlp_on_device's default chunk: the most rows whose [rows, 2·I + 2·H] fp32 device intermediate
// stays near 2 GiB (≥ 1). DeviceStates::propagate_mlp cuts its rows the same way.
int64_t plain_mlp_chunk_rows(int64_t H, int64_t I);
// The routes of a plain MLP run as one expert: m rows, top-1, every row to expert 0 with weight 1.
model::Routes one_expert_routes(int64_t m);

// Why layer L's attention block cannot run on the GPU during compression (LayerDevice::moe_inputs),
// "" when it can: the built-in GQA attention with a per-head q/k RMSNorm, no projection biases, plain
// RMSNorm weights and head_dim a multiple of 64 up to 256 (sliding windows are fine); or multi-head
// latent attention (model::MlaMixer) without biases, q/k and v head dims up to 256, plain RMSNorm
// weights. Any other layer's attention stays on the CPU (the experts and the propagation still use the GPU).
std::string gpu_attention_refusal(const io::ModelSpec& spec, const model::LayerWeights& L);

// Every option of a run, typed. The defaults here are the CLI's (cli/compress_flags.cpp binds its
// flags to these fields).
struct CompressOptions {
  const Method* method = &methods::kSgptq;  // a row of the method table (compress/method.h)
  SgptqOptions sgptq;    // SGPTQ, and the GPTQ step of obr; recorded for every method
  RefineOptions refine;  // refinement options (method moesq)
  JsqOptions jsq;        // method jsq (compress/jsq.h)
  ObrOptions obr;        // method obr (compress/obr.h; percdamp and GPTQ block from `sgptq`)
  int threads = 0;       // 0: all cores
  Device device = Device::kCpu;  // recorded in report.json and the resume manifest (the bits differ by device)
  const ExpertDevice* expert_device = nullptr;  // kCuda: the rows, targets and error on the GPU (null: CPU)
  const LayerDevice* layer_device = nullptr;    // kCuda: the propagation's routed experts on the GPU (null: CPU)
};

// True when compress_model keeps the calibration states on the GPU for the whole run (DeviceStates):
// opt.layer_device can make them, every layer's attention runs on the GPU (gpu_attention_refusal) and
// no MoE layer has a gated shared expert (Qwen2-MoE's runs on the CPU). Dense MLP layers and ungated
// shared experts (DeepSeek-V3 / Kimi-K2) propagate on the device (DeviceStates::propagate_mlp,
// propagate's shared). Otherwise each layer's attention that can runs on the GPU with host states
// (LayerDevice::moe_inputs), the rest on the CPU.
bool device_resident(const model::DecoderModel& m, const CompressOptions& opt);

// What happened to one expert.
struct ExpertReport {
  int64_t layer = 0, expert = 0;
  int64_t tokens = 0;          // calibration rows routed to the expert
  double rel_error = 0;        // ‖Y − Ŷ‖²_F / ‖Y‖²_F on those rows, Ŷ under W4A4 (0 tokens → NaN → null)
  bool fallback = false;       // no/too few tokens: documented fallback used
  std::string note;
  nlohmann::json extra;        // method-specific (refinement curves, …)
  // Wall seconds of the expert's task (compress_and_install; not in report.json): the rows and targets
  // (GPU: upload + Y on the device; CPU: Y with cblas), the method's solve, the error + dequantization.
  struct StageSeconds {
    double targets = 0, solve = 0, error = 0;
    // Of solve, the refinement's own stages (method moesq; refine::RefineResult::stage_seconds) and of
    // optimize the steps' issue time (curves.epoch_seconds). Not written to report.json.
    double refine_prepare = 0, refine_start = 0, refine_optimize = 0, refine_steps = 0, refine_finish = 0;
  } stage_seconds;
};

// Wall seconds of each stage of Algorithm 1 for one layer (compress_model; `moesq bench compress`).
struct LayerSeconds {
  int64_t layer = 0;
  double routing = 0;      // attention + post-attention norm over the calibration, router + top-k, per-expert row cache
  double attention = 0;    // of `routing`: the attention blocks and the post-attention norm alone
  double experts = 0;      // the layer's experts (this rank's, exchanged with the others), or a committed layer's install
  double propagation = 0;  // H_{l+1} through the compressed layer (W4A4), the next-inputs hash and the commit
  // Σ over the experts this rank solved of their worker-thread wall (ExpertReport::stage_seconds; the
  // refinement's share of `solve` separately): shows which stage the `experts` wall is made of.
  double targets = 0, solve = 0, refinement = 0, error = 0;
  // The refinement's own stages summed over the experts (refine::RefineResult::stage_seconds: prepare,
  // start = uploads + initial loss, optimize = epochs with their evals and best-epoch snapshots, finish
  // = argmax + pack + final loss), and of optimize the steps' issue time (curves.epoch_seconds).
  double refine_prepare = 0, refine_start = 0, refine_optimize = 0, refine_steps = 0, refine_finish = 0;
};

struct CompressResult {
  std::vector<std::vector<PackedExpert>> experts;  // [L][E]
  std::vector<ExpertReport> reports;               // [L·E]
  std::vector<LayerSeconds> layer_seconds;         // [L]
  double seconds = 0;
  int64_t resumed_layers = 0;                      // layers taken from the work dir (--resume), not recomputed
};

// How compress_model runs: over which processes, and where finished layers are committed.
struct RunContext {
  dist::Communicator* comm = nullptr;  // the ranks sharing the experts (null: this process alone)
  // Rank 0 only (null on the others, or for no commits): every finished layer is committed there,
  // and the layers it already holds (--resume) are taken from it instead of being compressed again.
  WorkDir* work = nullptr;
};

// The calibration rows of one expert (gathered from the routed layer input).
struct ExpertCalib {
  std::vector<float> X;  // [n, H]
  // [n, H] or empty: the same tokens' rows in the ORIGINAL model's states (RefineOptions::
  // original_targets): the refinement's targets are the original expert on these instead of on X.
  std::vector<float> X_target;
  std::vector<float> g;  // [n] router combine weight of this expert for the row
  int64_t n = 0;
  int64_t schedule_rows = 0;  // the layer's mean training rows per expert (schedule rule, per-layer scope)
  std::vector<int32_t> seq;   // [n] the calibration sequence each row comes from (layer-wide schedule)
  int64_t num_sequences = 0;  // calibration sequences of the run
  // Device-resident states (DeviceStates): X is left empty; the expert's rows are rows[i] of the
  // layer's X on the GPU (dev_X [n_total, H] fp32, valid while the layer is compressed).
  const float* dev_X = nullptr;
  std::vector<int64_t> rows;  // [n]
  // Device-resident states with room for the layer's expert outputs (DeviceStates::expert_outputs):
  // the GPU error stage writes Ŷ [n, H] here and sets *dev_Yq_kept = 1 (the propagation reuses it).
  float* dev_Yq = nullptr;
  uint8_t* dev_Yq_kept = nullptr;
};

// Compresses one expert with `opt.method` (its row's compress; what compress_model runs per expert;
// also the Python module's compress_expert). `w` holds the original weights (gate/up [I, H], down [H, I]), y_ref
// [c.n, H] their outputs on the expert's calibration rows (the refinement's targets; unused by the
// one-shot methods). rep.layer / rep.expert name the tensors in errors, in spec's family layout
// (io::expert_tensor_prefix); fallbacks and notes go to rep.
// dev: the rows on the GPU (ExpertDevice::rows; then y_ref may be empty), or null.
PackedExpert compress_expert(const io::ModelSpec& spec, const model::ExpertWeights& w, int64_t H, int64_t I,
                             const ExpertCalib& c, const std::vector<float>& y_ref, const CompressOptions& opt,
                             ExpertReport& rep, const DeviceRows* dev = nullptr);

// Algorithm 1 lines 5–16 for one expert, as compress_model runs it: the targets Y = expert(X), the
// method's solve (compress_expert), the W4A4 reconstruction error into rep.rel_error, then the
// dequantized weights installed in w in place of the original ones. On the GPU when
// opt.expert_device is set (the rows stay there for every stage), else on the CPU. act_block: the
// activation block of the deployed format (32 sparse, 16 dense).
PackedExpert compress_and_install(const io::ModelSpec& spec, model::ExpertWeights& w, int64_t H, int64_t I,
                                  const ExpertCalib& c, const CompressOptions& opt, int act_block, ExpertReport& rep);

// Every option checked once (moesq::Error naming the option), before any work: the shared ones, then
// the method's own (its row's validate). The CLI calls it when it builds the options, compress_model
// again at its top.
void validate(const CompressOptions& opt);

// Compresses every routed expert of `m` (which must be the ORIGINAL model; it is modified in place:
// on return its experts hold the dequantized compressed weights; how it runs is never changed: every
// forward gets its model::ForwardOptions per call). A model whose experts load on demand
// (model::LoadOptions::experts_on_demand) holds one layer's experts at a time: layer l's are loaded
// after its attention and routing and released after its propagation (on return none are loaded). Collective over run.comm: every rank calls it
// with the same model, calibration and options, and every rank returns the whole result.
// Resumed layers are installed from their records and the next layer's inputs recomputed through
// them; their SHA-256 must equal the committed one (Error otherwise: the run is not reproducible).
CompressResult compress_model(model::DecoderModel& m, const CalibSet& calib, const CompressOptions& opt,
                              const RunContext& run = {});

}  // namespace moesq::compress

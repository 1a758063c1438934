// `moesq eval DIR --data FILE...` — nats per predicted token of a checkpoint (original or
// compressed) on token files; a table on stdout, or with --json exactly one JSON object.
// The non-obvious decision: `--act-quant auto` (the default) evaluates a compressed checkpoint
// W4A4 — NVFP4 activations with the weights' block size — because that is how it is deployed;
// `--act-quant none` gives the W4A16 number.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/expert_parallel.h"
#include "core/error.h"
#include "core/threads.h"
#include "model/eval.h"
#ifdef MOESQ_HAVE_CUDA
#include "runtime/eval_cuda.h"
#endif

namespace moesq::cli {

namespace {

struct EvalArgs {
  std::string dir;
  std::vector<std::string> data;
  int64_t seq_len = 512;
  bool json = false;
  std::string act_quant = "auto";
  std::string split = "all";
  int threads = 0;
  std::string device = "cpu";     // cpu | cuda (the GPU engine, src/runtime)
  std::string experts = "auto";   // GPU expert backend
  std::string deterministic = "on";  // GPU engine: batch-invariant logits (on) or the faster cuBLAS path (off)
  bool allow_mixed = false;
  bool check_finite = false;      // GPU engine: runtime::EngineOptions::check_finite
  std::string expert_exchange = "auto";  // under mpirun: the expert-parallel exchange (cli/expert_parallel.h)
};

void run_eval(const EvalArgs& a) {
  MOESQ_CHECK(a.seq_len >= 2, "--seq-len: ", a.seq_len, " is too short (a window needs >= 2 tokens)");
  MOESQ_CHECK(a.threads >= 0, "--threads: ", a.threads, " must be >= 0 (0 = all cores)");
  check_finite_needs_cuda(a.check_finite, a.device);
  if (a.threads > 0) set_num_threads(a.threads);
  model::EvalOptions opt;
  opt.seq_len = a.seq_len;
  opt.split = io::parse_split(a.split);
  opt.act_quant = model::parse_act_quant(a.act_quant);
  opt.threads = a.threads;
  opt.allow_mixed = a.allow_mixed;
  std::string backend;
  model::EvalResult r;
  int ranks = 1;  // expert-parallel ranks of the GPU engine
  std::string exchange;
  if (a.device == "cuda") {
#ifdef MOESQ_HAVE_CUDA
    runtime::CudaEvalOptions co;
    co.eval = opt;
    co.experts = runtime::parse_expert_backend(a.experts);
    co.deterministic = a.deterministic == "on";
    co.check_finite = a.check_finite;
    // Under `mpirun -np N` (N > 1): the expert-parallel engine, rank 0 prints (cli/expert_parallel.h).
    const ExpertParallel ep("eval", a.expert_exchange);
    co.engine_options = [&ep](const io::ModelSpec& s, runtime::EngineOptions& eo) { ep.apply(s.num_experts, eo); };
    ep.run([&] { r = runtime::evaluate_checkpoint_cuda(a.dir, a.data, co, &backend); });
    if (!ep.root()) return;
    ranks = ep.ranks(), exchange = ep.exchange();
#else
    MOESQ_FAIL("--device cuda: this moesq was built without CUDA");
#endif
  } else {
    MOESQ_CHECK(a.experts == "auto", "--experts applies to --device cuda only");
    MOESQ_CHECK(a.deterministic == "on", "--deterministic off applies to --device cuda only (the CPU forward is always "
                "batch-invariant)");
    r = model::evaluate_checkpoint(a.dir, a.data, opt);
  }

  if (a.json) {
    nlohmann::json j;
    j["model"] = r.model;
    j["nats_per_token"] = r.nats_per_token;
    j["act_quant"] = r.act_quant;
    if (r.act_block > 0) j["act_block_size"] = r.act_block;
    j["expert_format"] = r.expert_format;
    j["seq_len"] = r.seq_len;
    j["split"] = r.split;
    j["predicted_tokens"] = r.predicted;
    j["seconds"] = r.seconds;
    if (!backend.empty()) j["device"] = "cuda", j["experts"] = backend, j["deterministic"] = a.deterministic == "on";
    if (ranks > 1) j["expert_parallel_ranks"] = ranks, j["expert_exchange"] = exchange;
    j["files"] = nlohmann::json::array();
    for (const auto& f : r.files)
      j["files"].push_back({{"path", f.path},
                            {"tokens", f.tokens},
                            {"predicted_tokens", f.predicted},
                            {"windows", f.windows},
                            {"nats_per_token", f.nats_per_token}});
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("model %s  experts %s  act_quant %s  seq_len %lld  split %s\n", r.model.c_str(),
              r.expert_format.c_str(), r.act_quant.c_str(), static_cast<long long>(r.seq_len),
              r.split.c_str());
  std::printf("%-48s %10s %10s %12s\n", "file", "tokens", "predicted", "nats/token");
  for (const auto& f : r.files)
    std::printf("%-48s %10lld %10lld %12.4f\n", f.path.c_str(), static_cast<long long>(f.tokens),
                static_cast<long long>(f.predicted), f.nats_per_token);
  std::printf("%-48s %10s %10lld %12.4f\n", "all", "", static_cast<long long>(r.predicted),
              r.nats_per_token);
  std::printf("%.2f s\n", r.seconds);
}

}  // namespace

void register_eval(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  auto* cmd = app.add_subcommand(
      "eval",
      "Nats per predicted token of a checkpoint on token files. Each file is cut into windows of\n"
      "--seq-len tokens; every token after the first of a window is predicted. Compressed\n"
      "checkpoints are evaluated W4A4 (NVFP4 activations) unless --act-quant none.");
  cmd->add_option("DIR", args->dir, "checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--data", args->data, "text files (through DIR/tokenizer.json; bytes for a byte-level model) or .npy token-id files")->required();
  cmd->add_option("--seq-len", args->seq_len, "tokens per window")->capture_default_str();
  cmd->add_flag("--json", args->json, "print one JSON object instead of a table");
  cmd->add_option("--act-quant", args->act_quant,
                  "activation quantization: auto (W4A4 for compressed checkpoints), none, nvfp4")
      ->check(CLI::IsMember({"auto", "none", "nvfp4"}))
      ->capture_default_str();
  cmd->add_option("--split", args->split,
                  "part of each file: all, train (first 98 %), heldout (last 2 %)")
      ->check(CLI::IsMember({"all", "train", "heldout"}))
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "worker threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--device", args->device, "cpu (the reference forward) or cuda (the GPU engine)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--experts", args->experts,
                  "GPU expert backend: auto, bf16, sparse-w4a4, sparse-w4a16 (awq-w4a16, nvfp4-w4a16: not built)")
      ->capture_default_str();
  cmd->add_option("--deterministic", args->deterministic,
                  "GPU engine: on = a window's logits are bitwise the same whatever else is in its batch (ops::gemm_bf16 "
                  "outside the experts); off = cuBLAS there (faster, batch-dependent rounding)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--allow-mixed", args->allow_mixed,
                "load a half-compressed checkpoint (some routed-expert projections dense, the rest packed)");
  add_check_finite_flag(cmd, args->check_finite);
  add_expert_exchange_flag(cmd, args->expert_exchange);
  cmd->callback([args] { run_eval(*args); });
}

}  // namespace moesq::cli

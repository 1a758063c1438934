// `moesq compress DIR --method M --out OUT`: paper Algorithm 1 on a Hugging Face MoE checkpoint.
// Writes OUT (the compressed checkpoint, docs/FORMAT.md) and OUT/report.json; nothing on failure.
// Under mpirun / srun every rank runs this command; the experts are shared among the ranks and rank 0
// alone writes the work dir (crash-safe resume), OUT and stdout (docs/PARALLEL.md).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

#include "cli/commands.h"
#include "cli/compress_flags.h"
#include "cli/expert_parallel.h"
#include "compress/report.h"
#include "compress/work_dir.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/threads.h"
#include "dist/communicator.h"
#include "dist/gpu_binding.h"
#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "io/export_checkpoint.h"
#include "model/decoder.h"
#ifdef MOESQ_HAVE_CUDA
#include <cuda_runtime.h>

#include "compress/refine/cuda_step_backend.h"
#include "compress/expert_cuda.h"
#include "compress/sgptq_cuda.h"
#include "core/cuda/require_device.h"
#endif

namespace moesq::cli {

namespace {

struct Args {
  std::string dir, out, method, export_format = "moesq", device = "auto";
  bool json = false, resume = false;
  CompressFlags flags;
};

void run_compress(const Args* args, dist::Communicator& comm);

}  // namespace

void register_compress(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "compress",
      "Compress the routed experts of a Hugging Face MoE checkpoint (paper Algorithm 1; every model_type\n"
      "of the README's table: qwen3_moe, qwen2_moe, mixtral, olmoe, deepseek_v3, qwen3_next, gpt_oss, ...)\n"
      "and write a compressed checkpoint plus OUT/report.json (method, measured bits/weight, seconds, per-expert calibration\n"
      "tokens and relative reconstruction error). Without --calib, calibration sequences are sampled\n"
      "from the model itself (data-free). Every finished layer is committed to OUT.work (removed at the\n"
      "end): after a crash, the same command with --resume continues from the last committed layer.\n"
      "Expert-parallel: `mpirun -np N moesq compress ...` shares each layer's experts among N ranks\n"
      "(same output bits as one process; docs/PARALLEL.md).");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("DIR", args->dir, "Hugging Face checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--method", args->method, method_help())
      ->required();
  cmd->add_option("--out", args->out, "output checkpoint directory (replaced atomically)")->required();
  cmd->add_flag("--json", args->json, "print the report summary as one JSON object on stdout");
  cmd->add_option("--export-format", args->export_format,
                  "layout of OUT: moesq (docs/FORMAT.md §7) | compressed-tensors (nvfp4-pack-quantized, what\n"
                  "vLLM loads) | moesq-pair-bitmask (see `moesq export --help`)");
  cmd->add_flag("--resume", args->resume,
                "continue an interrupted run from the layers committed in OUT.work (refused, naming what\n"
                "differs, if the options, calibration or source changed; no OUT.work: start from layer 1)");
  cmd->add_option("--device", args->device,
                  "where the experts of --method sgptq / moesq are solved: cuda (Hessians, SGPTQ and the\n"
                  "refinement's steps on the GPU, one expert per thread on its own stream; fp64 SGPTQ, fp32\n"
                  "refinement with the CPU's schedule and noise) | cpu (the reference) | auto (cuda when this\n"
                  "build has CUDA, a GPU is present, the method is sgptq or moesq and the experts are plain\n"
                  "SwiGLU; else cpu). The experts' targets and errors run there too; routing and the\n"
                  "propagation run on the CPU so far.")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  add_compress_flags(cmd, args->flags);
  cmd->callback([args] {
    const std::unique_ptr<dist::Communicator> comm = dist::communicator_from_environment();
    dist::run_or_abort_all(*comm, [&] { run_compress(args.get(), *comm); });
  });
}

// --device → where the refinement runs (compress::Device, RefineOptions::device). Errors: cuda asked
// for a build without CUDA, a machine without a GPU, or experts the GPU refinement does not implement.
void resolve_device(const std::string& flag, const io::ModelSpec& spec, compress::CompressOptions& opt,
                    const std::string& gpu_gemm) {
  const bool plain_experts = !spec.expert_bias && !spec.clamped_swiglu;
  if (flag == "cpu") return;
  if (flag == "cuda") {
    MOESQ_CHECK(compress::gpu_method(*opt.method), "--device cuda: --method ", opt.method->name,
                " runs on the CPU only (the GPU runs sgptq and moesq): use --device cpu");
    MOESQ_CHECK(plain_experts, "--device cuda: this checkpoint's experts have biases / a clamped SwiGLU (gpt-oss), "
                               "which the GPU refinement does not implement; use --device cpu");
  }
#ifdef MOESQ_HAVE_CUDA
  if (flag == "cuda") require_cuda_device("--device cuda");
  int n = 0;
  const bool gpu = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();  // a failed query leaves a sticky error
  if (!gpu || !compress::gpu_method(*opt.method) || !plain_experts) return;  // auto: the CPU
  opt.device = compress::Device::kCuda;
  opt.sgptq.device = compress::sgptq_expert_cuda;
  opt.expert_device = compress::expert_device_cuda();
  opt.layer_device = compress::layer_device_cuda();
  if (opt.method->refines) opt.refine.device = compress::refine::make_cuda_step_backend;
  // The default precision: bf16-forward (the forward GEMMs on bf16 tensor cores over the exact NVFP4
  // operands, TF32 gradients): a Qwen3-30B-A3B layer 14.1 s against tf32-backward's 19.2 s, the fixture's
  // held-out nats within seed noise of it over 8 runs (bench/NOTES.md "GPU compression v5").
  if (gpu_gemm.empty() && opt.method->refines) compress::set_gpu_gemm(opt.refine, "bf16-forward");
#else
  (void)gpu_gemm;
  MOESQ_CHECK(flag != "cuda", "--device cuda: this moesq was built without CUDA (use --device cpu)");
#endif
}

namespace {

// One process per GPU: this rank takes the GPU of its host-local rank (dist/gpu_binding.h); rank 0
// says which, and whether ranks share GPUs.
void bind_gpu(const dist::Communicator& comm) {
#ifdef MOESQ_HAVE_CUDA
  const auto [gpu, n] = gpu_of_rank(comm, "--device cuda");
  compress::use_gpu(gpu);
  if (comm.size() == 1 && n == 1) return;
  cudaDeviceProp p{};
  MOESQ_CHECK(cudaGetDeviceProperties(&p, gpu) == cudaSuccess, "cudaGetDeviceProperties of GPU ", gpu, " failed");
  const std::string note = dist::gpu_sharing_note(comm.local_size(), n);
  progress("compress", "rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) + " on GPU " +
                           std::to_string(gpu) + " of " + std::to_string(n) + " (" + p.name +
                           "; each rank takes GPU host-local rank mod " + std::to_string(n) + ")" +
                           (note.empty() ? "" : "; " + note));
#else
  (void)comm;
#endif
}

void run_compress(const Args* args, dist::Communicator& comm) {
  const bool root = comm.rank() == 0;
  if (!root) set_progress_enabled(false);  // rank 0 speaks for the run
  if (args->flags.opt.threads > 0) set_num_threads(args->flags.opt.threads);
  compress::CompressOptions opt = args->flags.options(args->method);
  args->flags.check_flags_apply(*opt.method);
  const io::ExportFormat fmt = io::parse_export_format(args->export_format, "--export-format");
  std::vector<std::string> inputs = args->flags.calib;
  inputs.push_back(args->dir);
  if (root) { AtomicDir probe(args->out, "--out", "report.json", inputs); }  // fail now, not after minutes of work
  io::Checkpoint ckpt(args->dir);
  // A compressed-tensors INT4 checkpoint is a valid source (the loader dequantizes it, docs/FORMAT.md);
  // anything else already quantized is not.
  MOESQ_CHECK(!ckpt.config().contains("quantization_config") ||
                  io::read_quantization_config(ckpt).storage == io::ExpertStorage::Int4,
              "checkpoint ", args->dir,
              " is already quantized (config.json has quantization_config); compress the original");
  resolve_device(args->device, ckpt.spec(), opt, args->flags.gpu_gemm);  // before the weights are read
  MOESQ_CHECK((!opt.refine.tf32_gemm && !opt.refine.tf32_backward && !opt.refine.bf16_forward) ||
                  opt.device == compress::Device::kCuda,
              "--gpu-gemm ", args->flags.gpu_gemm,
              " applies to the refinement on the GPU, and this run refines on the CPU (--device ",
              args->device, ")");
  // Host memory bounded by one layer's experts (plus the rest of the model and the calibration):
  // compress_model loads each layer's experts when it reaches it and frees them after.
  model::DecoderModel m(ckpt, {.experts_on_demand = true});
  if (opt.device == compress::Device::kCuda) {
    bind_gpu(comm);
    progress("compress", std::string("SGPTQ") + (opt.method->refines ? " and the refinement" : "") +
                             " on the GPU (--device " + args->device + "); routing and propagation " +
                             (compress::device_resident(m, opt) ? "on the GPU too (the states stay there)"
                                                                : "on the CPU (a layer the GPU forward lacks)"));
  }
  // The calibration's own time (data-free: sampling the sequences from the model, often minutes) is
  // reported beside the compression's (report.json "calibration_seconds", the summary line).
  const auto t_calib = std::chrono::steady_clock::now();
  // Data-free calibration samples from the whole model: every layer's experts are read for it (the
  // whole model in host memory while sampling), then freed again.
  const bool sample = args->flags.calib.empty() || args->flags.calib_sampled > 0;
  for (int64_t l = 0; sample && l < m.spec().num_layers; ++l) m.load_experts(l);
  const compress::CalibSet calib = args->flags.calibration(m, args->dir);
  for (int64_t l = 0; sample && l < m.spec().num_layers; ++l) m.release_experts(l);
  const double calib_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_calib).count();
  std::optional<compress::WorkDir> work;
  if (root) work.emplace(args->out, compress::run_manifest(ckpt, calib, opt), args->resume);
  const compress::CompressResult r = compress::compress_model(m, calib, opt, {&comm, work ? &*work : nullptr});
  if (!root) return;
  // Another layout: the moesq checkpoint goes to a temporary sibling, then is exported into OUT. Its
  // name is one of OUT's temporaries (`OUT.tmp.<pid>.moesq`), so that after a kill -9 the next run
  // writing OUT removes it (core/atomic_file.h); `OUT.moesq.tmp.<pid>` was never cleaned.
  // `--out x/` names x: the sibling is x.tmp.<pid>.moesq, not x/.tmp... (which failed after all the work).
  std::filesystem::path out_path = std::filesystem::path(args->out).lexically_normal();
  if (out_path.filename().empty()) out_path = out_path.parent_path();
  const std::string moesq_out = fmt == io::ExportFormat::Moesq
                                    ? args->out
                                    : out_path.string() + ".tmp." + std::to_string(::getpid()) + ".moesq";
  struct RemoveTmp {
    std::string dir;
    ~RemoveTmp() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } tmp{fmt == io::ExportFormat::Moesq ? "" : moesq_out};
  const OnInterrupt tmp_on_interrupt = tmp.dir.empty() ? OnInterrupt() : OnInterrupt::remove(tmp.dir);  // SIGINT
  const compress::ExportSummary s =
      compress::write_compressed(ckpt, r, opt, calib, moesq_out,
                                 {{"source", args->dir}, {"calibration_seconds", calib_seconds}});
  nlohmann::json exported;
  if (fmt != io::ExportFormat::Moesq) exported = io::export_checkpoint(moesq_out, fmt, args->out, "report.json");
  work->remove();  // OUT is complete: nothing left to resume
  // Per-layer reconstruction loss, before → after refinement (also OUT/loss_per_layer.csv): on
  // stderr with --json (stdout is the JSON object), on stdout otherwise.
  FILE* table = args->json ? stderr : stdout;
  const bool refined = opt.method->refines;
  std::fprintf(table, "loss per layer (mean over experts; %s):\n",
               refined ? "held-out Eq. 4 loss, SGPTQ init -> refined" : "relative reconstruction error");
  for (const compress::LayerLoss& x : s.layer_loss) {
    // A layer without a loss to show (a dense-MLP layer, or one whose experts all lack calibration
    // tokens) says so instead of printing "nan" (the CSV leaves those fields empty).
    if (x.experts == 0) {
      std::fprintf(table, "  %s: %s\n", layer_label(x.layer, m.spec().num_layers).c_str(),
                   m.spec().is_moe_layer(x.layer) ? "no expert received calibration tokens (no loss measured)"
                                                  : "dense MLP, kept as stored (no routed experts)");
      continue;
    }
    if (refined)
      std::fprintf(table, "  %s: %.6g -> %.6g (%+.1f %%), rel error %.6g\n",
                   layer_label(x.layer, m.spec().num_layers).c_str(), x.init_hard_loss, x.final_hard_loss, 100.0 * (x.final_hard_loss / x.init_hard_loss - 1.0),
                   x.rel_error);
    else
      std::fprintf(table, "  %s: rel error %.6g\n", layer_label(x.layer, m.spec().num_layers).c_str(), x.rel_error);
  }
  const std::string out_dir = std::filesystem::path(args->out).string();
  std::fprintf(table, "  written: %s/loss_per_layer.csv%s\n", out_dir.c_str(),
               s.plot_note.empty() ? (", " + out_dir + "/loss_per_layer.png").c_str()
                                   : ("; note: " + s.plot_note).c_str());
  if (args->json) {
    nlohmann::json j = s.report;
    j.erase("layers");
    j["out"] = args->out;
    j["ranks"] = comm.size();
    j["resumed_layers"] = r.resumed_layers;
    if (!exported.is_null()) j["export"] = exported;
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("method %s: %.4f bits/expert weight (measured), %.1f s (+ %.1f s %s), mean relative error %s -> %s\n",
                opt.method->name, s.bits_per_expert_weight, r.seconds, calib_seconds,
                args->flags.calib.empty() ? "sampling the calibration from the model" : "reading the calibration",
                s.report["mean_rel_error"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str(), args->out.c_str());
  }
}

}  // namespace

}  // namespace moesq::cli

// `moesq generate DIR (--prompt TEXT | --prompt-ids F) --max-new-tokens N [--temperature T --top-p P
// --seed S] --device cpu|cuda [--experts B] [--json]`: continues a prompt. Greedy by default. Text in
// and out through the checkpoint's tokenizer (DIR/tokenizer.json, the byte identity for a byte-level
// model: io::load_tokenizer_for_checkpoint); token ids out when it has none. --prompt is encoded with
// the post-processor (a prompt starts a sequence: BOS where the tokenizer adds one); the printed text
// is the decode of the generated ids only, special tokens kept. The loop is runtime::Generator's over
// a decode backend: CPU the KV-cached model::KvDecoder; CUDA the GPU engine (runtime/engine.h),
// prefill then decode steps replayed from a CUDA graph.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/checkpoint.h"
#include "io/tokenizer.h"
#include "model/kv_decoder.h"
#include "model/decoder.h"
#include "runtime/backend.h"
#include "runtime/decode_backend.h"
#include "runtime/generator.h"
#include "runtime/sampler.h"
#ifdef MOESQ_HAVE_CUDA
#include "runtime/engine.h"
#include "runtime/engine_backend.h"
#endif

namespace moesq::cli {

namespace {

struct GenerateArgs {
  std::string dir, prompt, prompt_ids, device = "cpu", experts = "auto";
  std::string deterministic = "on";  // GPU engine: batch-invariant (on) or the faster cuBLAS path (off)
  int64_t max_new = 32;
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 0;
  bool json = false;
  bool check_finite = false;  // GPU engine: runtime::EngineOptions::check_finite
  int num_prompts = 0;    // how many of --prompt, --prompt-ids were given (an empty --prompt counts)
  bool from_ids = false;  // --prompt-ids was given
};

// The ids of a --prompt-ids file, each checked against the vocabulary [0, V) before it is narrowed
// to int32 (4294967297 must not become id 1).
std::vector<int32_t> read_ids(const std::string& path, int64_t V) {
  std::ifstream f(path);
  MOESQ_CHECK(f.good(), "--prompt-ids: cannot open ", path);
  std::vector<int32_t> ids;
  long long v;
  while (f >> v) {
    MOESQ_CHECK(v >= 0 && v < V, "--prompt-ids ", path, ": id ", v, " (item ", ids.size(), ") outside [0, ", V, ")");
    ids.push_back(static_cast<int32_t>(v));
  }
  MOESQ_CHECK(f.eof(), "--prompt-ids: ", path, " is not whitespace-separated integers");
  return ids;
}

void run_generate(const GenerateArgs& a) {
  MOESQ_CHECK(a.num_prompts == 1, "generate: give exactly one of --prompt, --prompt-ids");
  MOESQ_CHECK(a.max_new >= 1, "--max-new-tokens: ", a.max_new, " must be >= 1");
  check_finite_needs_cuda(a.check_finite, a.device);
  const io::Checkpoint ckpt(a.dir);
  const int64_t V = ckpt.spec().vocab_size;
  // The tokenizer, when the checkpoint has one (a --prompt needs it: the error names DIR).
  std::optional<io::Tokenizer> tok;
  std::error_code ec;
  if (!a.from_ids || V == 256 || std::filesystem::exists(std::filesystem::path(a.dir) / "tokenizer.json", ec))
    tok = io::load_tokenizer_for_checkpoint(a.dir);
  std::vector<int32_t> prompt;
  if (!a.from_ids) {
    try {
      prompt = tok->encode(a.prompt, io::EncodeOptions{.add_special_tokens = true});
    } catch (const Error& e) {
      MOESQ_FAIL("--prompt: ", e.what());
    }
  } else {
    prompt = read_ids(a.prompt_ids, V);
  }
  MOESQ_CHECK(!prompt.empty(), "generate: the prompt is empty");
  for (int32_t t : prompt) MOESQ_CHECK(t >= 0 && t < V, "generate: prompt id ", t, " outside [0, ", V, ")");
  const int64_t total = static_cast<int64_t>(prompt.size()) + a.max_new;
  // The sum, not "--max-new-tokens 2004" for a 4-token prompt and --max-new-tokens 2000.
  const int64_t max_pos = ckpt.spec().max_position_embeddings;
  MOESQ_CHECK(max_pos <= 0 || total <= max_pos, "prompt (", prompt.size(), " tokens) + --max-new-tokens ", a.max_new,
              " = ", total, " exceeds the model's max_position_embeddings (", max_pos, ")");
  runtime::SamplerOptions so;
  so.temperature = a.temperature, so.top_p = a.top_p, so.seed = a.seed;
  runtime::check_sampler_options(so);  // before any loading, as every flag
  runtime::StopOptions stop;
  stop.max_new_tokens = a.max_new;
  double ttft = 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::string backend = "cpu";
  // Prefill, then sample / decode until --max-new-tokens (runtime::Generator over the device's backend).
  auto generate = [&](runtime::DecodeBackend& dec) {
    runtime::Generator gen(dec);
    const int seq = gen.add(prompt, so, stop);
    ttft = seconds();
    while (!gen.finished(seq)) gen.step();
    return gen.output(seq);
  };
  std::vector<int32_t> out;
  if (a.device == "cuda") {
#ifdef MOESQ_HAVE_CUDA
    runtime::EngineOptions eo;
    eo.experts = runtime::parse_expert_backend(a.experts);
    eo.deterministic = a.deterministic == "on";
    eo.check_finite = a.check_finite;
    eo.max_seqs = 1, eo.max_len = total, eo.max_tokens = total;
    runtime::Engine eng(ckpt, eo);
    backend = runtime::expert_backend_name(eng.backend());
    runtime::EngineDecodeBackend dec(eng);
    out = generate(dec);
#else
    MOESQ_FAIL("--device cuda: this moesq was built without CUDA");
#endif
  } else {
    MOESQ_CHECK(a.experts == "auto", "--experts applies to --device cuda only");
    MOESQ_CHECK(a.deterministic == "on", "--deterministic off applies to --device cuda only");
    const model::DecoderModel m(ckpt);
    // A config without max_position_embeddings bounds nothing: a huge --max-new-tokens ended in
    // "internal error: std::bad_alloc" here (the cache is allocated for `total` tokens up front).
    // Checked against the machine's memory before allocating: under a sanitizer (and with overcommit
    // off) an impossible request aborts or is killed instead of throwing std::bad_alloc. The size is
    // the decoder's own (KvDecoder::cache_bytes: every mixer's decode state).
    std::optional<runtime::CpuDecodeBackend> cache;
    auto too_large = [&](const std::string& why) {
      MOESQ_FAIL("--max-new-tokens ", a.max_new, ": cannot allocate the KV cache for ", total, " tokens (", why, ")");
    };
    const double cache_bytes = static_cast<double>(model::KvDecoder::cache_bytes(m, total));
    const double ram = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
    if (ram > 0 && cache_bytes > ram) {
      char why[160];
      std::snprintf(why, sizeof why, "needs about %.3g GiB, more than this machine's %.3g GiB of memory",
                    cache_bytes / 1073741824.0, ram / 1073741824.0);
      too_large(why);
    }
    try {
      cache.emplace(m, total, 1, m.default_forward_options());
    } catch (const std::bad_alloc& e) {
      too_large(e.what());
    } catch (const std::length_error& e) {  // past vector::max_size()
      too_large(e.what());
    }
    out = generate(*cache);
  }
  const double secs = seconds();
  std::string text;
  if (tok) {
    try {
      text = tok->decode(out);
    } catch (const Error& e) {  // an id of the model's padded vocabulary that the tokenizer lacks
      std::fprintf(stderr, "WARNING: generate: cannot decode the output (%s); printing token ids\n", e.what());
      tok.reset();
    }
  }
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.dir;
    j["device"] = a.device;
    j["experts"] = backend;
    if (a.device == "cuda") j["deterministic"] = a.deterministic == "on";
    j["prompt_tokens"] = prompt.size();
    j["generated_ids"] = out;
    if (tok) j["text"] = text;
    j["ttft_s"] = ttft;
    j["seconds"] = secs;
    j["decode_tokens_per_s"] = out.size() > 1 ? (out.size() - 1) / std::max(secs - ttft, 1e-9) : 0.0;
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  if (tok) {
    std::printf("%s\n", text.c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
    std::printf("\n");
  }
  progress("generate", std::to_string(out.size()) + " tokens in " + std::to_string(secs) + " s (" + a.device + ")");
}

}  // namespace

void register_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate",
                                 "Continue a prompt with a checkpoint (greedy by default). Text in and out through\n"
                                 "DIR/tokenizer.json (bytes for a byte-level model); token ids out when DIR has none.");
  cmd->add_option("DIR", args->dir, "checkpoint directory")->required()->check(CLI::ExistingDirectory);
  auto count_prompt = [args](const std::string&) { ++args->num_prompts; };
  cmd->add_option("--prompt", args->prompt, "prompt text (encoded by DIR/tokenizer.json with its BOS / post-processor)")
      ->each(count_prompt);
  cmd->add_option("--prompt-ids", args->prompt_ids, "file of whitespace-separated prompt token ids")
      ->each([args](const std::string&) { ++args->num_prompts, args->from_ids = true; });
  cmd->add_option("--max-new-tokens", args->max_new, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "nucleus mass in (0, 1]")->capture_default_str();
  // CLI11 reads "-1" into a uint64 as 2^64 - 1: a negative seed is refused instead.
  cmd->add_option("--seed", args->seed, "sampling seed (>= 0)")
      ->check(CLI::Validator(
          [](std::string& s) { return s.find('-') == std::string::npos ? std::string() : "must be >= 0 (got " + s + ")"; },
          ">= 0"))
      ->capture_default_str();
  cmd->add_option("--device", args->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--experts", args->experts, "GPU expert backend: auto, bf16, sparse-w4a4, sparse-w4a16")
      ->capture_default_str();
  cmd->add_option("--deterministic", args->deterministic,
                  "GPU engine: on = batch-invariant arithmetic (the tokens do not depend on what else runs); off = cuBLAS "
                  "outside the experts (faster)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  add_check_finite_flag(cmd, args->check_finite);
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace moesq::cli

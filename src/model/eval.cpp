// Evaluation driver: files → windows → window_nll in parallel → per-file and overall nats/token.
#include "model/eval.h"

#include <atomic>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/progress.h"
#include "core/threads.h"
#include "io/checkpoint.h"
#include "core/blas_threads.h"

namespace moesq::model {

const char* act_quant_name(ActQuant a) {
  switch (a) {
    case ActQuant::Auto: return "auto";
    case ActQuant::None: return "none";
    case ActQuant::Nvfp4: return "nvfp4";
  }
  return "?";
}

ActQuant parse_act_quant(const std::string& s) {
  if (s == "auto") return ActQuant::Auto;
  if (s == "none") return ActQuant::None;
  if (s == "nvfp4") return ActQuant::Nvfp4;
  MOESQ_FAIL("--act-quant: \"", s, "\" is not one of auto, none, nvfp4");
}

namespace {

struct WindowJob {
  size_t file = 0;
  std::vector<int32_t> tokens;  // [<= seq_len]
};

}  // namespace

std::vector<double> window_nll_sums(const DecoderModel& model, const std::vector<std::vector<int32_t>>& windows,
                                    const ForwardOptions& fo, int threads_opt, std::vector<int64_t>* predicted) {
  // Forward single-threaded per window; windows in parallel.
  ForwardOptions one = fo;
  one.threads = 1;
  const int threads = threads_opt > 0 ? threads_opt : num_threads();
  std::vector<double> sum(windows.size(), 0.0);  // [windows] Σ nll (nats)
  predicted->assign(windows.size(), 0);          // [windows] predicted tokens
  std::atomic<int64_t> done{0};
  const int64_t n = static_cast<int64_t>(windows.size());
  const int64_t step = std::max<int64_t>(1, n / 20);
  // OpenBLAS would otherwise start its own threads inside each window's GEMMs while we already
  // run one window per core (and its sgemm rounds differently with 1 vs N threads).
  ScopedBlasSingleThread single;
  parallel_for(
      n,
      [&](int64_t i) {
        const double mean = model.window_nll(windows[i], one, &(*predicted)[i]);
        sum[i] = mean * static_cast<double>((*predicted)[i]);
        const int64_t d = ++done;
        if (d % step == 0 || d == n) progress("eval", std::to_string(d) + "/" + std::to_string(n) + " windows");
      },
      threads);
  return sum;
}

void reduce_window_sums(EvalResult* res, const std::vector<size_t>& file_of, const std::vector<double>& sum,
                        const std::vector<int64_t>& count, const char* who) {
  std::vector<double> file_sum(res->files.size(), 0.0);
  double total = 0.0;
  for (size_t i = 0; i < sum.size(); ++i) {
    file_sum[file_of[i]] += sum[i];
    res->files[file_of[i]].predicted += count[i];
    total += sum[i];
    res->predicted += count[i];
  }
  for (size_t f = 0; f < res->files.size(); ++f)
    res->files[f].nats_per_token = file_sum[f] / static_cast<double>(res->files[f].predicted);
  res->nats_per_token = total / static_cast<double>(res->predicted);
  MOESQ_CHECK(std::isfinite(res->nats_per_token), "eval: non-finite nats/token (", res->nats_per_token, ") — ", who,
              " produced NaN/Inf logits");
}

ForwardOptions resolve_forward_options(const DecoderModel& model, ActQuant act_quant) {
  ForwardOptions fo = model.default_forward_options();
  switch (act_quant) {
    case ActQuant::Auto: break;  // compressed → W4A4 (set by the loader), bf16 → none
    case ActQuant::None: fo.act_quant = false; break;
    case ActQuant::Nvfp4: fo.act_quant = true; break;  // act_block: the checkpoint's, else 32
  }
  return fo;
}

EvalResult evaluate_model(const DecoderModel& model, const std::vector<std::string>& files,
                          const EvalOptions& opt) {
  MOESQ_CHECK(!files.empty(), "eval: no data files given (--data)");
  MOESQ_CHECK(opt.seq_len >= 2, "--seq-len: ", opt.seq_len, " is too short (a window needs >= 2 tokens)");
  model.spec().check_seq_len(opt.seq_len, "--seq-len");
  const auto t0 = std::chrono::steady_clock::now();
  EvalResult res;
  const ForwardOptions fo = resolve_forward_options(model, opt.act_quant);
  res.act_quant = fo.act_quant ? "nvfp4" : "none";
  res.act_block = fo.expert_act_block();
  res.expert_format = model.expert_format();
  res.seq_len = opt.seq_len;
  res.split = io::split_name(opt.split);

  std::vector<WindowJob> jobs;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::vector<int32_t> tokens = io::load_tokens(files[f], model.spec().vocab_size, opt.split,
                                                       opt.text_tokenizer ? &*opt.text_tokenizer : nullptr);
    MOESQ_CHECK(tokens.size() >= 2, "data file ", files[f], " has ", tokens.size(),
                " tokens (split ", io::split_name(opt.split), "): nothing to predict");
    FileEval fe;
    fe.path = files[f];
    fe.tokens = static_cast<int64_t>(tokens.size());
    for (auto& w : io::make_windows(tokens, opt.seq_len)) {
      ++fe.windows;
      jobs.push_back({f, std::move(w)});
    }
    res.files.push_back(fe);
  }

  std::vector<std::vector<int32_t>> windows;
  windows.reserve(jobs.size());
  for (auto& j : jobs) windows.push_back(std::move(j.tokens));
  std::vector<int64_t> count;
  const std::vector<double> sum = window_nll_sums(model, windows, fo, opt.threads, &count);
  std::vector<size_t> file_of;
  file_of.reserve(jobs.size());
  for (const auto& j : jobs) file_of.push_back(j.file);
  reduce_window_sums(&res, file_of, sum, count, "the model");
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

EvalResult evaluate_checkpoint(const std::string& dir, const std::vector<std::string>& files,
                               const EvalOptions& opt) {
  progress("eval", "loading " + dir);
  const io::Checkpoint ckpt(dir);
  const DecoderModel model(ckpt, LoadOptions{.allow_mixed = opt.allow_mixed});
  EvalOptions o = opt;
  if (!o.text_tokenizer) o.text_tokenizer = io::text_tokenizer_for(dir, files);
  EvalResult r = evaluate_model(model, files, o);
  r.model = dir;
  return r;
}

}  // namespace moesq::model

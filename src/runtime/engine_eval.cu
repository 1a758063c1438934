// GPU evaluation driver (eval_cuda.h): windows → batched engine prefills → per-window Σ nll (fp64, the
// CPU formula) → per-file and overall nats/token reduced in window order, as model::evaluate_model.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/cuda/require_device.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/checkpoint.h"
#include "io/tokens.h"
#include "model/tensor_math.h"
#include "runtime/engine.h"
#include "runtime/eval_cuda.h"

namespace moesq::runtime {

model::EvalResult evaluate_checkpoint_cuda(const std::string& dir, const std::vector<std::string>& files,
                                           const CudaEvalOptions& opt, std::string* backend_used) {
  MOESQ_CHECK(!files.empty(), "eval: no data files given (--data)");
  MOESQ_CHECK(opt.eval.seq_len >= 2, "--seq-len: ", opt.eval.seq_len, " is too short (a window needs >= 2 tokens)");
  MOESQ_CHECK(opt.batch >= 1, "eval: batch must be >= 1");
  require_cuda_device("eval --device cuda");
  progress("eval", "loading " + dir + " onto the GPU");
  const io::Checkpoint ckpt(dir);
  ckpt.spec().check_seq_len(opt.eval.seq_len, "--seq-len");
  EngineOptions eo;
  if (opt.engine_options) opt.engine_options(ckpt.spec(), eo);  // an expert-parallel rank's GPU and shard first
  HostModel host = load_host_model(ckpt, opt.experts, eo.expert_begin, eo.expert_end);
  // --act-quant: auto keeps the backend's own; none / nvfp4 pick the paired 4:8 variant.
  if (opt.eval.act_quant == model::ActQuant::None && host.backend == ExpertBackend::kSparseW4A4 &&
      opt.experts == ExpertBackend::kAuto)
    host = load_host_model(ckpt, ExpertBackend::kSparseW4A16, eo.expert_begin, eo.expert_end);
  MOESQ_CHECK(opt.eval.act_quant != model::ActQuant::None || !host.act_quant,
              "--act-quant none contradicts --experts sparse-w4a4 (use sparse-w4a16)");
  MOESQ_CHECK(opt.eval.act_quant != model::ActQuant::Nvfp4 || host.act_quant,
              "--act-quant nvfp4 on the GPU needs the sparse-w4a4 backend (a paired-4:8 checkpoint)");
  eo.max_seqs = opt.batch, eo.max_len = opt.eval.seq_len, eo.max_tokens = opt.batch * opt.eval.seq_len;
  eo.deterministic = opt.deterministic;
  eo.check_finite = opt.check_finite;
  Engine eng(std::move(host), eo);
  if (backend_used) *backend_used = expert_backend_name(eng.backend());

  const auto t0 = std::chrono::steady_clock::now();
  model::EvalResult res;
  res.model = dir;
  res.act_quant = eng.act_quant() ? "nvfp4" : "none";
  res.act_block = eng.act_quant() ? eng.act_block() : 0;
  res.expert_format = eng.expert_format();
  res.seq_len = opt.eval.seq_len;
  res.split = io::split_name(opt.eval.split);
  const std::optional<io::Tokenizer> tok =
      opt.eval.text_tokenizer ? opt.eval.text_tokenizer : io::text_tokenizer_for(dir, files);
  std::vector<std::vector<int32_t>> windows;
  std::vector<size_t> file_of;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::vector<int32_t> tokens = io::load_tokens(files[f], eng.spec().vocab_size, opt.eval.split,
                                                       tok ? &*tok : nullptr);
    MOESQ_CHECK(tokens.size() >= 2, "data file ", files[f], " has ", tokens.size(), " tokens (split ", res.split,
                "): nothing to predict");
    model::FileEval fe;
    fe.path = files[f];
    fe.tokens = static_cast<int64_t>(tokens.size());
    for (auto& w : io::make_windows(tokens, opt.eval.seq_len)) {
      ++fe.windows;
      windows.push_back(std::move(w));
      file_of.push_back(f);
    }
    res.files.push_back(fe);
  }
  const int64_t V = eng.spec().vocab_size;
  std::vector<double> sum(windows.size(), 0.0);
  std::vector<int64_t> count(windows.size(), 0);
  for (size_t w0 = 0; w0 < windows.size(); w0 += opt.batch) {
    const size_t w1 = std::min(windows.size(), w0 + opt.batch);
    std::vector<SeqChunk> chunks;
    for (size_t w = w0; w < w1; ++w) chunks.push_back({static_cast<int>(w - w0), windows[w]});
    eng.reset();
    const std::vector<float> z = eng.forward(chunks, true);
    int64_t row = 0;
    for (size_t w = w0; w < w1; ++w) {
      const std::vector<int32_t>& tk = windows[w];
      const int64_t T = static_cast<int64_t>(tk.size());
      if (T < 2) {  // a 1-token tail window predicts nothing (make_windows avoids it; be safe)
        row += T;
        continue;
      }
      // Same formula and rounding as window_nll_sums: the mean (model::next_token_nll), times the count.
      const double mean = model::next_token_nll(z.data() + row * V, tk, V);
      sum[w] = mean * static_cast<double>(T - 1);
      count[w] = T - 1;
      row += T;
    }
    progress("eval", std::to_string(w1) + "/" + std::to_string(windows.size()) + " windows (cuda)");
  }
  model::reduce_window_sums(&res, file_of, sum, count,
                            opt.check_finite ? "the GPU engine"
                                             : "the GPU engine (--check-finite names the layer, expert and token where "
                                               "the first NaN / inf appears)");
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace moesq::runtime

// Sliding-window attention of the built-in GQA attention (qwen3_moe / qwen2_moe `use_sliding_window`,
// `sliding_window`, `max_window_layers`, `layer_types`, as transformers 5.x applies them): which layers
// slide, a window layer equal to full attention over just the last `window` tokens (a direct check that
// does not share the masking code: RoPE scores depend only on relative positions), the fast path equal
// to its plain-loop twin, and the whole model on a copy of the tiny qwen3_moe checkpoint with
// use_sliding_window = true, sliding_window = 16 — different from full attention past position 16,
// identical before it, and the KV-cached decoder equal to the full forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/kv_decoder.h"
#include "model/mixers/attention.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kWindow = 16;
// Window attention vs full attention over the window's tokens at shifted positions: the same math,
// but RoPE's cos/sin (fp32) are taken at other positions, so scores differ by a few ulps of |q||k|.
constexpr float kShiftAtol = 1e-4f, kShiftRtol = 1e-4f;
// Fast path (sgemm, blocked) vs plain-loop twin on the same inputs: summation order only.
constexpr float kRefAtol = 1e-5f;
// KV decoder vs full forward (matvec vs sgemm, per-step softmax), as tests/model/test_kv_decoder.cpp.
constexpr float kLogitAtol = 2e-3f;
// Positions inside the window: the same math as full attention; the whole forward runs its
// expert GEMMs on OpenBLAS threads, whose partition (and so rounding) may differ between two calls.
constexpr float kInsideAtol = 1e-4f;
// Past the window the logits must move by more than rounding: a window of 16 over 48 tokens of a
// random-weight model changes logits by ~1e-1 (measured); 1e-3 is far above fp32 noise.
constexpr float kMustDiffer = 1e-3f;

json read_json(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

// A copy of `src` (config.json rewritten by `edit`, the safetensors files linked).
std::string checkpoint_copy(const std::string& src, const fs::path& dst, const std::function<void(json&)>& edit) {
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().filename() != "config.json") fs::create_symlink(fs::absolute(e.path()), dst / e.path().filename());
  json cfg = read_json(fs::path(src) / "config.json");
  edit(cfg);
  std::ofstream(dst / "config.json") << cfg.dump(2);
  return dst.string();
}

std::vector<int64_t> windows(const json& cfg) {
  const moesq::io::ModelSpec s = moesq::io::parse_config(cfg, "config.json");
  std::vector<int64_t> w;
  for (int64_t l = 0; l < s.num_layers; ++l) w.push_back(s.window_of(l));
  return w;
}

TEST(ModelSlidingWindow, LayersSlideAsTransformersDecides) {
  const json q3 = read_json(fs::path(MOESQ_DEFAULT_MODEL) / "config.json");  // 4 layers
  json c = q3;
  EXPECT_EQ(windows(c), std::vector<int64_t>(4, 0)) << "use_sliding_window false: full attention";
  c["use_sliding_window"] = true;
  EXPECT_EQ(windows(c), std::vector<int64_t>(4, 0)) << "sliding_window null: transformers' full causal mask";
  c["sliding_window"] = kWindow;
  // Neither is a Qwen3MoeConfig field; Qwen3MoeModel slides every layer.
  c["max_window_layers"] = 2;
  c["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "sliding_attention"};
  EXPECT_EQ(windows(c), std::vector<int64_t>(4, kWindow));
  c["sliding_window"] = 0;
  EXPECT_THROW(windows(c), moesq::Error) << "a window of 0 with use_sliding_window";

  // Qwen2-MoE: config.json's layer_types (transformers 5 writes it; the fixture's says full everywhere).
  json q2 = read_json(std::string(MOESQ_FIXTURES) + "/families/tiny-qwen2-moe/config.json");
  const int64_t L2 = q2["num_hidden_layers"].get<int64_t>();
  ASSERT_EQ(L2, 3);
  q2["use_sliding_window"] = true;
  q2["sliding_window"] = kWindow;
  EXPECT_EQ(windows(q2), std::vector<int64_t>(3, 0)) << "layer_types all full_attention";
  q2["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  EXPECT_EQ(windows(q2), (std::vector<int64_t>{kWindow, 0, kWindow}));
  q2["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_THROW(windows(q2), moesq::Error) << "layer_types of the wrong length";
  q2["layer_types"] = {"full_attention", "sliding", "full_attention"};
  try {
    windows(q2);
    ADD_FAILURE() << "an unknown layer type was accepted";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_types[1]"), std::string::npos) << e.what();
  }
  // Without layer_types, Qwen2MoeConfig's default: layer i slides when i is even and i < max_window_layers
  // (default 28).
  q2.erase("layer_types");
  q2.erase("max_window_layers");
  std::vector<int64_t> want(static_cast<size_t>(L2), 0);
  for (int64_t l = 0; l < L2; l += 2) want[l] = kWindow;
  EXPECT_EQ(windows(q2), want) << "default max_window_layers 28";
  q2["max_window_layers"] = 1;
  want.assign(static_cast<size_t>(L2), 0);
  want[0] = kWindow;
  EXPECT_EQ(windows(q2), want);
}

// Layer 0 of the tiny model with a window: row t equals full causal attention over x[t − W + 1 .. t]
// alone (its last row), and the fast path equals the plain-loop twin.
TEST(ModelSlidingWindow, WindowLayerIsFullAttentionOverTheLastWindowTokens) {
  const moesq::io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  const moesq::model::DecoderModel m(ckpt);
  const moesq::io::ModelSpec& s = m.spec();
  const moesq::model::ForwardOptions fo = m.default_forward_options();
  moesq::model::LayerWeights win = m.layer(0), full = m.layer(0);
  win.attention_window = kWindow;
  full.attention_window = 0;
  const int64_t T = 40, H = s.hidden_size;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(T * H);  // [T, H]
  for (float& v : x) v = nd(rng);

  const std::vector<float> y = moesq::model::gqa_attention(s, win, x.data(), T, fo);       // [T, H]
  const std::vector<float> y_ref = moesq::model::gqa_attention_ref(s, win, x.data(), T, fo);
  const std::vector<float> y_full = moesq::model::gqa_attention(s, full, x.data(), T, fo);
  ASSERT_EQ(y.size(), static_cast<size_t>(T * H));
  float ref_worst = 0, moved = 0;
  bool nonzero = false;
  for (int64_t i = 0; i < T * H; ++i) {
    ref_worst = std::max(ref_worst, std::fabs(y[i] - y_ref[i]));
    nonzero |= y[i] != 0.0f;
    if (i / H < kWindow) {
      EXPECT_EQ(y[i], y_full[i]) << "row " << i / H << " col " << i % H << ": inside the window nothing changes";
    } else {
      moved = std::max(moved, std::fabs(y[i] - y_full[i]));
    }
  }
  EXPECT_TRUE(nonzero);
  EXPECT_LT(ref_worst, kRefAtol) << "fast path vs plain-loop twin, window " << kWindow;
  EXPECT_GT(moved, kMustDiffer) << "the window changed nothing past position " << kWindow;

  for (int64_t t = kWindow; t < T; t += 5) {
    const int64_t lo = t - kWindow + 1;
    const std::vector<float> sub = moesq::model::gqa_attention_ref(s, full, x.data() + lo * H, kWindow, fo);
    for (int64_t c = 0; c < H; ++c) {
      const float want = sub[(kWindow - 1) * H + c], got = y[t * H + c];
      ASSERT_LE(std::fabs(got - want), kShiftAtol + kShiftRtol * std::fabs(want))
          << "row t = " << t << " col " << c << ": window attention " << got << " vs full attention over rows ["
          << lo << ", " << t << "] " << want;
    }
  }
}

TEST(ModelSlidingWindow, ForwardHonoursTheWindowAndTheKvDecoderMatchesIt) {
  moesq::test::TempDir dir("moesq_sliding_window");
  const std::string win_dir = checkpoint_copy(MOESQ_DEFAULT_MODEL, dir.path / "win", [](json& c) {
    c["use_sliding_window"] = true;
    c["sliding_window"] = kWindow;
  });
  const moesq::model::DecoderModel full(moesq::io::Checkpoint(MOESQ_DEFAULT_MODEL)), win(moesq::io::Checkpoint{win_dir});
  ASSERT_EQ(win.layer(0).attention_window, kWindow);
  moesq::io::SafetensorsFile ref(std::string(MOESQ_FIXTURES) + "/tiny-reference.safetensors");
  const std::vector<float> ids = moesq::io::to_f32(ref.get("input_ids"));
  const int64_t T = 48, V = win.spec().vocab_size;
  const std::vector<int32_t> tokens(ids.begin(), ids.begin() + T);
  const std::vector<float> lw = win.forward(tokens, win.default_forward_options());    // [T, V]
  const std::vector<float> lf = full.forward(tokens, full.default_forward_options());  // [T, V]
  float moved = 0;
  for (int64_t i = 0; i < T * V; ++i) {
    if (i / V < kWindow) ASSERT_NEAR(lw[i], lf[i], kInsideAtol) << "position " << i / V << " is inside the window";
    else moved = std::max(moved, std::fabs(lw[i] - lf[i]));
  }
  EXPECT_GT(moved, kMustDiffer) << "use_sliding_window evaluated like full attention";

  moesq::model::KvDecoder dec(win, T, win.default_forward_options());
  float worst = 0;
  int64_t worst_t = -1;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> step = dec.step(tokens[t]);
    for (int64_t v = 0; v < V; ++v)
      if (const float d = std::fabs(step[v] - lw[t * V + v]); d > worst) {
        worst = d;
        worst_t = t;
      }
  }
  EXPECT_LT(worst, kLogitAtol) << "KV decoder vs forward, worst at position " << worst_t;
}

}  // namespace

// KvDecoder::cache_bytes (every mixer's Mixer::decode_state_bytes) against the bytes a KvDecoder's
// decode state really allocates, for the default model and every family fixture: the built-in GQA
// K/V cache (qwen3-moe, olmoe, mixtral, qwen2-moe), MLA's latent cache (deepseek-v3), Gated
// DeltaNet's conv + recurrent state with gated attention (qwen3-next, qwen3.5-moe), gpt-oss's sink
// attention with its window-bounded cache on sliding layers. The allocation is measured by counting
// every operator new / delete of this program (live bytes after construction and after each step).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include "io/checkpoint.h"
#include "model/decoder.h"
#include "model/kv_decoder.h"

namespace {

std::atomic<int64_t> g_live_bytes{0};  // operator-new bytes not yet deleted
constexpr size_t kHeader = 16;         // size prefix of each block (keeps max_align_t alignment)

}  // namespace

void* operator new(std::size_t n) {
  void* p = std::malloc(n + kHeader);
  if (!p) throw std::bad_alloc();
  *static_cast<std::size_t*>(p) = n;
  g_live_bytes += static_cast<int64_t>(n);
  return static_cast<char*>(p) + kHeader;
}
void operator delete(void* p) noexcept {
  if (!p) return;
  char* block = static_cast<char*>(p) - kHeader;
  g_live_bytes -= static_cast<int64_t>(*reinterpret_cast<std::size_t*>(block));
  std::free(block);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

namespace {

using moesq::model::DecoderModel;
using moesq::model::KvDecoder;

// What a KvDecoder holds besides its length-dependent state: the per-layer vector headers and state
// objects (a few hundred bytes per layer on these 2–4-layer fixtures), constant in max_len.
constexpr int64_t kBookkeepingBytes = 4096;
// Lengths: below and past 2·window − 1 = 127 rows of gpt-oss's sliding layers (window 64).
constexpr int64_t kShortLen = 70, kLongLen = 140;

std::string model_dir(const std::string& arch) {
  if (arch == "qwen3-moe") return MOESQ_DEFAULT_MODEL;
  return std::string(MOESQ_FIXTURES) + "/families/tiny-" + arch;
}

// Largest live bytes of a KvDecoder of max_len over construction and max_len steps.
int64_t measured_state_bytes(const DecoderModel& m, int64_t max_len) {
  moesq::model::ForwardOptions fo = m.default_forward_options();
  fo.threads = 1;  // no worker-thread allocations in the count
  const int64_t V = m.spec().vocab_size, before = g_live_bytes.load();
  int64_t peak = 0;
  {
    KvDecoder dec(m, max_len, fo);
    peak = g_live_bytes.load() - before;
    for (int64_t t = 0; t < max_len; ++t) {
      dec.step(static_cast<int32_t>((7 * t + 3) % V));
      peak = std::max(peak, g_live_bytes.load() - before);
    }
  }
  return peak;
}

class KvCacheBytes : public ::testing::TestWithParam<std::string> {};

TEST_P(KvCacheBytes, MatchesWhatTheDecoderAllocates) {
  const moesq::io::Checkpoint ck(model_dir(GetParam()));
  const DecoderModel m(ck);
  measured_state_bytes(m, kLongLen);  // warm-up: thread-local scratch of the first steps
  const int64_t got_short = measured_state_bytes(m, kShortLen), got_long = measured_state_bytes(m, kLongLen);
  const int64_t want_short = KvDecoder::cache_bytes(m, kShortLen), want_long = KvDecoder::cache_bytes(m, kLongLen);
  std::printf("[kv cache bytes] %s: cache_bytes %lld / %lld, allocated %lld / %lld at %lld / %lld tokens\n",
              GetParam().c_str(), static_cast<long long>(want_short), static_cast<long long>(want_long),
              static_cast<long long>(got_short), static_cast<long long>(got_long), static_cast<long long>(kShortLen),
              static_cast<long long>(kLongLen));
  EXPECT_GT(want_short, 0);
  // What scales with the length is exactly the query's (the bookkeeping cancels).
  EXPECT_EQ(got_long - got_short, want_long - want_short)
      << GetParam() << ": measured " << got_short << " / " << got_long << " bytes at " << kShortLen << " / " << kLongLen
      << " tokens, cache_bytes " << want_short << " / " << want_long;
  for (auto [got, want] : {std::pair{got_short, want_short}, std::pair{got_long, want_long}}) {
    EXPECT_GE(got, want) << GetParam();
    EXPECT_LE(got - want, kBookkeepingBytes) << GetParam() << ": measured " << got << ", cache_bytes " << want;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, KvCacheBytes,
                         ::testing::Values("qwen3-moe", "olmoe", "mixtral", "qwen2-moe", "deepseek-v3", "qwen3-next",
                                           "qwen3.5-moe", "gpt-oss"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace_if(n.begin(), n.end(), [](char c) { return c == '-' || c == '.'; }, '_');
                           return n;
                         });

// The built-in GQA layers: the fp32 K and V caches and the RoPE tables, in closed form.
TEST(KvCacheBytesGqa, ClosedForm) {
  const moesq::io::Checkpoint ck(MOESQ_DEFAULT_MODEL);
  const DecoderModel m(ck);
  const auto& s = m.spec();
  const int64_t len = 300;
  EXPECT_EQ(KvDecoder::cache_bytes(m, len),
            4 * (2 * s.num_layers * len * s.num_kv_heads * s.head_dim + 2 * len * (s.head_dim / 2)));
}

// A length no machine holds saturates instead of wrapping (generate's memory check compares it).
TEST(KvCacheBytesGqa, SaturatesPastInt64) {
  for (const char* arch : {"qwen3-moe", "deepseek-v3", "gpt-oss", "qwen3-next"}) {
    const moesq::io::Checkpoint ck(model_dir(arch));
    const DecoderModel m(ck);
    EXPECT_EQ(KvDecoder::cache_bytes(m, int64_t(1) << 62), INT64_MAX) << arch;
  }
}

}  // namespace

#include "core/progress.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace moesq {

namespace {
std::mutex g_mu;
int g_state = -1;  // -1: read MOESQ_QUIET on first use
}

bool progress_enabled() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_state < 0) {
    const char* q = std::getenv("MOESQ_QUIET");
    g_state = (q && q[0] && q[0] != '0') ? 0 : 1;
  }
  return g_state == 1;
}

void set_progress_enabled(bool on) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_state = on ? 1 : 0;
}

std::string layer_label(int64_t layer, int64_t num_layers) {
  return "layer " + std::to_string(layer + 1) + "/" + std::to_string(num_layers);
}

std::string duration_text(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  char buf[64];
  if (seconds < 59.95) {
    std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  } else if (seconds < 3599.5) {
    const auto s = static_cast<long long>(std::llround(seconds));
    std::snprintf(buf, sizeof buf, "%lld min %02lld s", s / 60, s % 60);
  } else {
    const auto m = static_cast<long long>(std::llround(seconds / 60));
    std::snprintf(buf, sizeof buf, "%lld h %02lld min", m / 60, m % 60);
  }
  return buf;
}

std::string eta_text(double elapsed, double done, double total) {
  if (!(done > 0) || !(total > done) || !(elapsed >= 0)) return "";
  return "ETA " + duration_text(elapsed / done * (total - done));
}

void progress(const std::string& stage, const std::string& message) {
  if (!progress_enabled()) return;
  std::lock_guard<std::mutex> lk(g_mu);
  std::fprintf(stderr, "[%s] %s\n", stage.c_str(), message.c_str());
  std::fflush(stderr);
}

}  // namespace moesq

// The method table: every row of compress/methods/, in the order --help and errors list them.
#include "compress/method.h"

#include "core/error.h"

namespace moesq::compress {

namespace {

constexpr const Method* kMethods[] = {&methods::kRtnNvfp4, &methods::kMagnitude, &methods::kSgptq,
                                      &methods::kMoesq,    &methods::kJsq,       &methods::kObr};

// "a, b, c or d"
std::string listed(std::span<const Method* const> ms) {
  std::string s;
  for (size_t i = 0; i < ms.size(); ++i)
    s += (i == 0 ? "" : i + 1 == ms.size() ? " or " : ", ") + std::string(ms[i]->name);
  return s;
}

}  // namespace

std::span<const Method* const> all_methods() { return kMethods; }

const Method* parse_method(const std::string& s) {
  for (const Method* m : kMethods)
    if (s == m->name) return m;
  MOESQ_FAIL("--method: unknown method '", s, "' (expected ", listed(kMethods), ")");
}

}  // namespace moesq::compress

// Errors: one exception type whose message names the file, tensor or flag at fault.
// Why an exception: the CLI catches it at the top, prints it and exits non-zero, and the
// atomic writers below guarantee that nothing half-written is left behind on the way out.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace moesq {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace moesq

// MOESQ_CHECK(cond, "tensor ", name, " has K=", K, ", not a multiple of 32");
#define MOESQ_CHECK(cond, ...)                                       \
  do {                                                               \
    if (!(cond)) throw ::moesq::Error(::moesq::detail::concat(__VA_ARGS__)); \
  } while (0)
#define MOESQ_FAIL(...) throw ::moesq::Error(::moesq::detail::concat(__VA_ARGS__))

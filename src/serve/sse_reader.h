// Incremental reader of a server-sent-events stream (the WHATWG EventSource format, as OpenAI-style
// servers stream completions): bytes arrive in arbitrary chunks; every complete event's `data` is
// handed out once its blank line arrives. Lines end in LF, CRLF or CR; `:` lines are comments; an
// event's several `data:` lines are joined with LF; one space after the colon is dropped; fields
// other than `data` (event, id, retry) are ignored. Used by the load client (load_client.h).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace moesq::serve {

class SseReader {
 public:
  // Appends `n` bytes; returns the data of every event completed by them, in order.
  std::vector<std::string> feed(const char* bytes, size_t n);
  // Bytes held that do not yet end an event (a stream that ends here was cut mid-event).
  bool pending() const { return !line_.empty() || has_data_; }

 private:
  void end_line(std::vector<std::string>& out);

  std::string line_;   // the current line, without its terminator
  std::string data_;   // the current event's data lines, joined
  bool has_data_ = false;
  bool after_cr_ = false;  // the last byte was CR: an LF right after it ends nothing new
};

}  // namespace moesq::serve

// SseReader (sse_reader.h): line splitting and event assembly of the EventSource format.
#include "serve/sse_reader.h"

namespace moesq::serve {

std::vector<std::string> SseReader::feed(const char* bytes, size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    const char c = bytes[i];
    if (c == '\n' && after_cr_) {  // the LF of a CRLF: the CR already ended the line
      after_cr_ = false;
      continue;
    }
    after_cr_ = c == '\r';
    if (c == '\n' || c == '\r') {
      end_line(out);
      continue;
    }
    line_.push_back(c);
  }
  return out;
}

void SseReader::end_line(std::vector<std::string>& out) {
  if (line_.empty()) {  // a blank line dispatches the event (an event without data is dropped)
    if (has_data_) out.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_[0] != ':') {  // not a comment
    const size_t colon = line_.find(':');
    const std::string field = line_.substr(0, colon);
    if (field == "data") {
      std::string value = colon == std::string::npos ? std::string() : line_.substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.erase(0, 1);
      if (has_data_) data_.push_back('\n');
      data_ += value;
      has_data_ = true;
    }
  }
  line_.clear();
}

}  // namespace moesq::serve

// stop_strings.h: re-decode, search the unsent tail (and the hold-back before it) for stop strings.
#include "serve/stop_strings.h"

#include <algorithm>

#include "core/error.h"

namespace moesq::serve {

namespace {
// Bytes at the end of `s` that begin a UTF-8 character not yet complete.
size_t incomplete_utf8_tail(const std::string& s) {
  const size_t n = s.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const unsigned char c = static_cast<unsigned char>(s[n - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > k ? k : 0;
  }
  return 0;
}
}  // namespace

StopStringFilter::StopStringFilter(const io::Tokenizer* tok, std::vector<std::string> stop) : tok_(tok), stop_(std::move(stop)) {
  MOESQ_CHECK(tok_ || stop_.empty(), "stop strings need a tokenizer (this model has none): use stop_token_ids");
  for (const std::string& s : stop_) holdback_ = std::max(holdback_, s.size() - 1);
}

std::string StopStringFilter::add(const std::vector<int32_t>& ids) {
  if (stopped_ || ids.empty()) return "";
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  if (!tok_) return "";
  text_ = tok_->decode(ids_);
  // A stop string may start inside the held-back text, never before what was sent.
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) {
    const size_t p = text_.find(s, sent_);
    if (p != std::string::npos) cut = std::min(cut, p);
  }
  if (cut != std::string::npos) {
    text_.resize(cut);
    stopped_ = true;
    return flush();
  }
  size_t end = text_.size() >= holdback_ ? text_.size() - holdback_ : 0;
  end -= std::min(end, incomplete_utf8_tail(text_.substr(0, end)));
  if (end <= sent_) return "";
  std::string out = text_.substr(sent_, end - sent_);
  sent_ = end;
  return out;
}

std::string StopStringFilter::flush() {
  std::string out = sent_ < text_.size() ? text_.substr(sent_) : "";
  sent_ = text_.size();
  return out;
}

}  // namespace moesq::serve

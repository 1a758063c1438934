// Incremental detokenization with stop strings (OpenAI semantics): the text of a request is the
// tokenizer's decode of ALL its generated ids so far (so multi-token characters come out whole),
// cut before the first stop string found; text that could still become the start of a stop string,
// or an unfinished UTF-8 character, is held back until the next tokens decide it.
// Without a tokenizer (a synthetic model: `moesq serve --synthetic`) it only collects the ids and
// the text is always empty; stop strings then need a tokenizer (the constructor refuses them).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace moesq::serve {

class StopStringFilter {
 public:
  // `tok` null: no text (see above). Error: stop strings without a tokenizer.
  StopStringFilter(const io::Tokenizer* tok, std::vector<std::string> stop);
  // Appends generated ids; returns the text now safe to send. Errors: the tokenizer's (an id it lacks).
  std::string add(const std::vector<int32_t>& ids);
  // At the end of the sequence: the text held back.
  std::string flush();
  bool stopped() const { return stopped_; }  // a stop string was found: the request should end
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  const io::Tokenizer* tok_;
  std::vector<std::string> stop_;
  size_t holdback_ = 0;  // longest stop string - 1
  std::vector<int32_t> ids_;
  std::string text_;     // decode(ids_), cut at a stop string once found
  size_t sent_ = 0;      // bytes of text_ returned so far
  bool stopped_ = false;
};

}  // namespace moesq::serve

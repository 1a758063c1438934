// Generator (generator.h): per step, sample → stop conditions → one batched decode of the rest.
#include "runtime/generator.h"

#include <algorithm>

#include "core/error.h"

namespace moesq::runtime {

Generator::Generator(DecodeBackend& backend)
    : backend_(backend), slot_busy_(static_cast<size_t>(backend.num_slots()), 0) {}

int Generator::add(const std::vector<int32_t>& prompt, const SamplerOptions& sampling, const StopOptions& stop) {
  MOESQ_CHECK(!prompt.empty(), "generator: the prompt is empty");
  MOESQ_CHECK(stop.max_new_tokens >= 1, "generator: max_new_tokens ", stop.max_new_tokens, " must be >= 1");
  Sampler sampler(sampling);
  const auto free_slot = std::find(slot_busy_.begin(), slot_busy_.end(), 0);
  MOESQ_CHECK(free_slot != slot_busy_.end(), "generator: all ", slot_busy_.size(), " slots hold running sequences");
  const int slot = static_cast<int>(free_slot - slot_busy_.begin());
  std::vector<float> z = backend_.prefill(slot, prompt);
  slot_busy_[slot] = 1;
  seqs_.push_back(Sequence{slot, std::move(sampler), stop, {}, std::move(z), false});
  return static_cast<int>(seqs_.size() - 1);
}

int Generator::step() {
  const int64_t V = backend_.vocab_size();
  std::vector<int32_t> slots, tokens;
  std::vector<Sequence*> cont;
  for (Sequence& s : seqs_) {
    if (s.done) continue;
    const int32_t t = s.sampler.next(s.logits.data(), V);
    s.out.push_back(t);
    const bool stop = static_cast<int64_t>(s.out.size()) >= s.stop.max_new_tokens ||
                      std::find(s.stop.stop_ids.begin(), s.stop.stop_ids.end(), t) != s.stop.stop_ids.end();
    if (stop) {
      s.done = true;
      s.logits.clear();
      slot_busy_[s.slot] = 0;
      continue;
    }
    slots.push_back(s.slot), tokens.push_back(t), cont.push_back(&s);
  }
  if (cont.empty()) return 0;
  const std::vector<float> z = backend_.decode(slots, tokens);
  MOESQ_CHECK(static_cast<int64_t>(z.size()) == static_cast<int64_t>(cont.size()) * V, "generator: the backend returned ",
              z.size(), " logits for ", cont.size(), " rows of ", V);
  for (size_t b = 0; b < cont.size(); ++b) cont[b]->logits.assign(z.begin() + b * V, z.begin() + (b + 1) * V);
  return static_cast<int>(cont.size());
}

int Generator::running() const {
  return static_cast<int>(std::count_if(seqs_.begin(), seqs_.end(), [](const Sequence& s) { return !s.done; }));
}

const Generator::Sequence& Generator::seq_at(int seq) const {
  MOESQ_CHECK(seq >= 0 && seq < static_cast<int>(seqs_.size()), "generator: no sequence ", seq);
  return seqs_[static_cast<size_t>(seq)];
}

bool Generator::finished(int seq) const { return seq_at(seq).done; }
const std::vector<int32_t>& Generator::output(int seq) const { return seq_at(seq).out; }

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, const SamplerOptions& sampling,
                                         const StopOptions& stop) {
  const int id = add(prompt, sampling, stop);
  while (!finished(id)) step();
  return output(id);
}

}  // namespace moesq::runtime

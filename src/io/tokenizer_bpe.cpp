// The BPE model of io::Tokenizer: one pre-tokenized word → ids.
// Follows the `tokenizers` library's BPE::merge_word (characters → vocabulary ids, <0xNN> byte
// fallback, fused unknowns) and Word::merge_all (a min-heap of candidate merges ordered by
// (rank, position); a popped candidate is applied only if its pair is still adjacent and still
// merges to the same id). Non-obvious decision: the heap, not the textbook "rescan for the best pair"
// loop, because a byte-fallback tokenizer has no pre-tokenizer and a whole paragraph is one word:
// the heap is O(n log n) there, the rescan O(n²).
#include <queue>

#include "core/error.h"
#include "io/tokenizer_parts.h"

namespace moesq::io::tok {

namespace {

struct Symbol {
  int32_t id;
  int32_t prev, next;  // indices into the word's symbols; -1 at the ends
  uint32_t len;        // bytes covered; 0 = merged into its left neighbour
};

struct Merge {  // 12 bytes: a paragraph-long word puts millions of these on the heap
  uint32_t pos;
  int32_t rank, new_id;
  // std::priority_queue pops the largest: "larger" = lower rank, then lower position.
  bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  MOESQ_CHECK(word.size() < UINT32_MAX, "tokenizer: a word of ", word.size(), " bytes is too long for BPE");
  if (ignore_merges) {
    if (const auto it = vocab.find(std::string(word)); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  const auto add = [&](int32_t id, size_t len) {  // len < 2^32: checked below
    const int32_t n = static_cast<int32_t>(symbols.size());
    if (n) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, static_cast<uint32_t>(len)});
  };
  int32_t unk = -1;      // pending unknown run: its id (-1 = none) ...
  size_t unk_len = 0;    // ... and the bytes it covers
  std::string ch;
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::max<size_t>(1, utf8_seq_len(word, i));
    ch.assign(word.substr(i, n));
    i += n;
    if (const auto it = vocab.find(ch); it != vocab.end()) {
      if (unk >= 0) add(unk, unk_len), unk = -1;
      add(it->second, ch.size());
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (const char c : ch) all &= byte_ids[static_cast<uint8_t>(c)] >= 0;
      if (all) {  // tokenizers adds the bytes without flushing a pending unknown first
        for (const char c : ch) add(byte_ids[static_cast<uint8_t>(c)], 1);
        continue;
      }
    }
    if (unk_id) {
      if (unk >= 0 && fuse_unk) {
        unk_len += ch.size();
      } else {
        if (unk >= 0) add(unk, unk_len);
        unk = *unk_id, unk_len = ch.size();
      }
    }
    // no unk token: the character is dropped, as in tokenizers
  }
  if (unk >= 0) add(unk, unk_len);

  std::priority_queue<Merge> queue;
  const auto lookup = [&](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    const auto it = merges.find(pair_key(a, b));
    return it == merges.end() ? nullptr : &it->second;
  };
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const auto* m = lookup(symbols[k].id, symbols[k + 1].id)) queue.push({static_cast<uint32_t>(k), m->first, m->second});
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const size_t next_pos = static_cast<size_t>(cur.next);
    const Symbol right = symbols[next_pos];
    const auto* m = lookup(cur.id, right.id);
    if (!m || m->second != top.new_id) continue;  // stale candidate
    cur.id = top.new_id;
    cur.len += right.len;  // <= word.size() < 2^32
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
    if (cur.prev >= 0) {
      const size_t p = static_cast<size_t>(cur.prev);
      if (const auto* pm = lookup(symbols[p].id, cur.id)) queue.push({static_cast<uint32_t>(p), pm->first, pm->second});
    }
    if (cur.next >= 0) {
      if (const auto* nm = lookup(cur.id, symbols[static_cast<size_t>(cur.next)].id))
        queue.push({top.pos, nm->first, nm->second});
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len) out.push_back(s.id);
  }
}

}  // namespace moesq::io::tok

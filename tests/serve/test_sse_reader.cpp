// SseReader: events assembled the same whatever the chunking, the EventSource line rules.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "serve/sse_reader.h"

using moesq::serve::SseReader;

namespace {
std::vector<std::string> read_all(const std::string& stream, const std::vector<size_t>& cuts) {
  SseReader r;
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t c : cuts) {
    auto ev = r.feed(stream.data() + at, c - at);
    out.insert(out.end(), ev.begin(), ev.end());
    at = c;
  }
  auto ev = r.feed(stream.data() + at, stream.size() - at);
  out.insert(out.end(), ev.begin(), ev.end());
  EXPECT_FALSE(r.pending());
  return out;
}
}  // namespace

TEST(SseReader, LineRules) {
  const std::string s =
      ": a comment\n"
      "data: {\"a\":1}\n\n"
      "event: ignored\r\nid: 7\r\ndata:no-space\r\n\r\n"
      "data: two\ndata:  lines\n\n"
      "retry: 10\n\n"             // an event without data is dropped
      "data\n\n"                  // a field without a colon: empty data
      "data: cr only\r\r"
      "data: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "no-space", "two\n lines", "", "cr only", "[DONE]"};
  EXPECT_EQ(read_all(s, {}), want);
}

TEST(SseReader, AnyChunkingGivesTheSameEvents) {
  std::string s;
  std::vector<std::string> want;
  for (int i = 0; i < 50; ++i) {
    const std::string payload = "{\"i\":" + std::to_string(i) + ",\"t\":\"x\\ny\"}";
    s += (i % 3 == 0 ? "data: " : "data:") + payload + (i % 2 ? "\r\n\r\n" : "\n\n");
    want.push_back(payload);
  }
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts;
    for (size_t at = 0;;) {
      at += 1 + rng() % 9;
      if (at >= s.size()) break;
      cuts.push_back(at);
    }
    ASSERT_EQ(read_all(s, cuts), want) << "trial " << trial;
  }
}

TEST(SseReader, CutMidEventIsPending) {
  SseReader r;
  const std::string s = "data: {\"partial\"";
  EXPECT_TRUE(r.feed(s.data(), s.size()).empty());
  EXPECT_TRUE(r.pending());
  const std::string end = "}\n\n";
  const auto ev = r.feed(end.data(), end.size());
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0], "{\"partial\"}");
  EXPECT_FALSE(r.pending());
}

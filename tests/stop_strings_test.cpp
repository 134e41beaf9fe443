// Stop strings: the incremental matcher gives what a search of the whole
// held-back text gives, in work linear in the text; the caps on their number
// and length hold in the engine and through the server (400 naming `stop`).
#include <gtest/gtest.h>
#include <httplib.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/stop_strings.h"
#include "engine_run_util.h"
#include "server_harness.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

// The matcher as it was: every push searches the whole held-back text for
// every stop, then looks for the longest tail that starts one. The reference.
class WholeTextMatcher {
 public:
  explicit WholeTextMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  }
  std::string push(const std::string& text) {
    if (stopped_) return "";
    pending_ += text;
    size_t first = std::string::npos;
    for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
    if (first != std::string::npos) {
      stopped_ = true;
      std::string out = pending_.substr(0, first);
      pending_.clear();
      return out;
    }
    size_t keep = 0;
    for (const std::string& s : stops_)
      for (size_t len = std::min(s.size() - 1, pending_.size()); len > keep; --len)
        if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
          keep = len;
          break;
        }
    std::string out = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return out;
  }
  std::string flush() {
    std::string out;
    if (!stopped_) out.swap(pending_);
    return out;
  }
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

// Random text over a few pieces that overlap one another (ASCII and 2-, 3-
// and 4-byte UTF-8 characters sharing lead bytes), so that stops drawn from
// the same pieces match, overlap and half-match often.
std::string random_text(std::mt19937& rng, size_t pieces) {
  static const std::vector<std::string> kPieces = {"a", "b", "ab", "\n", "é", "è", "€", "😀", "<|", "|>"};
  std::string out;
  for (size_t i = 0; i < pieces; ++i) out += kPieces[rng() % kPieces.size()];
  return out;
}

// Stops of awkward sizes: drawn pieces, substrings of the text, prefixes
// and extensions of one another, a lone byte of a multi-byte character.
std::vector<std::string> random_stops(std::mt19937& rng, const std::string& text) {
  std::vector<std::string> stops;
  const size_t n = 1 + rng() % 6;
  while (stops.size() < n) {
    switch (rng() % 8) {
      case 0:
        stops.push_back(random_text(rng, 1 + rng() % 4));
        break;
      case 1:
        if (!text.empty()) {
          const size_t at = rng() % text.size();
          stops.push_back(text.substr(at, 1 + rng() % 12));
        }
        break;
      case 2:
        if (!stops.empty()) stops.push_back(stops[rng() % stops.size()] + random_text(rng, 1));  // extends one
        break;
      case 3:
        if (!stops.empty() && stops.back().size() > 1) stops.push_back(stops.back().substr(0, stops.back().size() - 1));
        break;
      case 4:
        stops.push_back(std::string(1, static_cast<char>(0xE2)));  // the lead byte of '€'
        break;
      default:
        stops.push_back(random_text(rng, 3 + rng() % 6));  // longer: matches rarely
    }
  }
  return stops;
}

}  // namespace

TEST(StopStringMatch, IncrementalEqualsTheWholeTextSearch) {
  std::mt19937 rng(20261205);
  int stopped = 0;
  for (int round = 0; round < 4000; ++round) {
    const std::string text = random_text(rng, rng() % 80);
    const std::vector<std::string> stops = random_stops(rng, text);
    StopStringMatcher incremental(stops);
    WholeTextMatcher reference(stops);
    std::string fed;
    for (size_t at = 0; at < text.size();) {
      const size_t n = std::min<size_t>(rng() % 8, text.size() - at);  // 0..7 bytes: tokens split characters too
      const std::string piece = text.substr(at, n);
      at += n;
      fed += piece;
      ASSERT_EQ(incremental.push(piece), reference.push(piece)) << "round " << round << " after " << fed;
      ASSERT_EQ(incremental.stopped(), reference.stopped()) << "round " << round;
      if (rng() % 40 == 0) {  // then on afresh
        ASSERT_EQ(incremental.flush(), reference.flush()) << "round " << round;
      }
    }
    ASSERT_EQ(incremental.flush(), reference.flush()) << "round " << round;
    stopped += incremental.stopped() ? 1 : 0;
  }
  EXPECT_GT(stopped, 1000);  // the cases cover both endings
  EXPECT_GT(4000 - stopped, 1000);
}

TEST(StopStringMatch, OverlappingAndNestedStopsCutAtTheEarliestStart) {
  StopStringMatcher m({"bcd", "abcdef", "cd"});
  EXPECT_EQ(m.push("xab"), "x");
  EXPECT_EQ(m.push("cd"), "a");  // "bcd" starts before "cd"; "abcdef" would start earlier but is not complete
  EXPECT_TRUE(m.stopped());
  StopStringMatcher prefix({"ab", "abc"});
  EXPECT_EQ(prefix.push("zza"), "zz");
  EXPECT_EQ(prefix.push("bc"), "");
  EXPECT_TRUE(prefix.stopped());
}

// A generation of 1 MiB pushed a few bytes at a time against the caps' worst
// case (16 stops of 256 bytes that all but match everywhere: 'a'...'a' then
// another byte): each byte costs a bounded number of steps whatever came
// before, and the held-back text never exceeds the longest stop.
TEST(StopStringMatch, WorkIsLinearInTheText) {
  std::vector<std::string> stops;
  for (size_t i = 0; i < kMaxStopStrings; ++i)
    stops.push_back(std::string(kMaxStopStringBytes - 1 - i, 'a') + static_cast<char>('b' + i));
  StopStringMatcher m(stops);
  const size_t total = size_t{1} << 20;
  size_t out = 0;
  std::mt19937 rng(7);
  for (size_t pushed = 0; pushed < total;) {
    const size_t n = std::min<size_t>(1 + rng() % 6, total - pushed);
    // Mostly 'a', now and then a byte that breaks every partial match.
    std::string piece(n, 'a');
    if (rng() % 97 == 0) piece.back() = 'z';
    out += m.push(piece).size();
    pushed += n;
    ASSERT_LE(pushed - out, kMaxStopStringBytes - 1);
  }
  EXPECT_FALSE(m.stopped());
  // KMP: per stop, one step per byte plus at most one fallback per byte ever advanced.
  EXPECT_LE(m.steps(), static_cast<int64_t>(2 * kMaxStopStrings * total));
  EXPECT_EQ(out + m.flush().size(), total);
}

using StopStringCaps = engine_run::TinyModelTest;

TEST_F(StopStringCaps, TheEngineRefusesTooManyOrTooLongStops) {
  Engine engine(*model_, *tokenizer_, EngineOptions{});
  GenerationRequest r = engine_run::greedy_request(tokenizer_->encode("the cat", false), 4);
  r.stop.assign(kMaxStopStrings, "x");
  EXPECT_NO_THROW(engine.submit(r, [](const GenerationEvent&) {}));
  r.stop.push_back("x");
  EXPECT_THROW(engine.submit(r, [](const GenerationEvent&) {}), Error);
  r.stop = {std::string(kMaxStopStringBytes, 'x')};
  EXPECT_NO_THROW(engine.submit(r, [](const GenerationEvent&) {}));
  r.stop = {std::string(kMaxStopStringBytes + 1, 'x')};
  EXPECT_THROW(engine.submit(r, [](const GenerationEvent&) {}), Error);
  engine.shutdown(true);
}

TEST(StopStringCapsServer, PastTheCapsA400NamesStop) {
  test_util::SynthModel synth;
  test_util::TestServer server(*synth.model, *synth.tokenizer);
  const auto post = [&](const json& stop) {
    json body = {{"prompt", "the cat"}, {"max_tokens", 2}, {"temperature", 0}, {"stop", stop}};
    return server.client().Post("/v1/completions", body.dump(), "application/json");
  };
  const std::string longest(kMaxStopStringBytes, 'q');
  const std::string too_long = longest + "q";
  json many = json::array();
  for (size_t i = 0; i <= kMaxStopStrings; ++i) many.push_back("s" + std::to_string(i));
  for (const json& bad : {json(too_long), json::array({"ok", too_long}), many}) {
    auto r = post(bad);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    const json e = json::parse(r->body, nullptr, false);
    EXPECT_EQ(e["error"]["param"], "stop") << r->body;
    EXPECT_EQ(e["error"]["type"], "invalid_request_error") << r->body;
  }
  many.erase(many.size() - 1);
  for (const json& good : {json(longest), many}) {
    auto r = post(good);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
}

// Per-request isolation in the engine: what throws in one request's own
// processing (its constraint's matcher on admission, masking or accepting,
// while drafting, its event callback) ends that request alone with an
// "error" naming the cause; the other requests of the batch produce the
// tokens of a quiet run, no KV block leaks, and the engine serves on.
#include <gtest/gtest.h>

#include <future>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_run_util.h"
#include "grammar/token_constraint.h"
#include "test_util.h"

using namespace kvserve;
using namespace kvserve::engine_run;
using kvserve::test_util::wait_idle;

namespace {

enum class FaultAt { kNewMatcher, kMask, kAccept, kRollback };

// Allows every token; throws "injected ..." once `after` tokens are accepted
// (kMask, kAccept: when asked to mask or to accept the next), at the first
// rollback (kRollback: only speculation rolls back, first when it checks
// its drafts while scheduling), or when a matcher is made (kNewMatcher).
class FaultyConstraint final : public CompiledConstraint {
 public:
  FaultyConstraint(FaultAt at, int32_t after) : at_(at), after_(after) {}
  std::unique_ptr<TokenMatcher> new_matcher() const override {
    if (at_ == FaultAt::kNewMatcher) throw std::runtime_error("injected fault: no matcher");
    return std::make_unique<Matcher>(at_, after_);
  }

 private:
  class Matcher final : public TokenMatcher {
   public:
    Matcher(FaultAt at, int32_t after) : at_(at), after_(after) {}
    void mask(std::span<float>) override {
      if (at_ == FaultAt::kMask && accepted_ >= after_) throw std::runtime_error("injected fault in mask");
    }
    bool accept(int32_t) override {
      if (at_ == FaultAt::kAccept && accepted_ >= after_) throw std::runtime_error("injected fault in accept");
      accepted_++;
      return true;
    }
    void rollback(int32_t n) override {
      if (at_ == FaultAt::kRollback) throw std::runtime_error("injected fault in rollback");
      accepted_ -= n;
    }
    bool finished() override { return false; }

   private:
    FaultAt at_;
    int32_t after_;
    int32_t accepted_ = 0;
  };
  FaultAt at_;
  int32_t after_;
};

struct Result {
  std::vector<std::vector<int32_t>> tokens;  // per sequence
  std::vector<std::string> finish_reasons;   // per sequence
  std::vector<std::string> errors;           // per sequence
};

// Submits every request at once and waits for every sequence's final event.
// throw_on_event: a request index whose callback throws on its first event.
std::vector<Result> run_all(Engine& engine, const std::vector<GenerationRequest>& requests, int throw_on_event = -1) {
  std::vector<Result> out(requests.size());
  std::vector<std::promise<void>> done(requests.size());
  std::vector<int32_t> unfinished(requests.size());
  std::vector<bool> thrown(requests.size(), false);
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto n = static_cast<size_t>(requests[i].n);
    out[i] = {std::vector<std::vector<int32_t>>(n), std::vector<std::string>(n), std::vector<std::string>(n)};
    unfinished[i] = requests[i].n;
    // Events of one request come one at a time on the engine thread.
    auto id = engine.submit(requests[i], [&, i](const GenerationEvent& ev) {
      const auto b = static_cast<size_t>(ev.index);
      out[i].tokens[b].insert(out[i].tokens[b].end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) {
        out[i].finish_reasons[b] = ev.finish_reason;
        out[i].errors[b] = ev.error;
        if (--unfinished[i] == 0) done[i].set_value();
      } else if (static_cast<int>(i) == throw_on_event && !thrown[i]) {
        thrown[i] = true;
        throw std::runtime_error("injected fault in the event callback");
      }
    });
    EXPECT_TRUE(id.has_value());
  }
  for (auto& d : done) d.get_future().wait();
  return out;
}

class RequestIsolation : public TinyModelTest {
 protected:
  static constexpr int64_t kTokens = 24;
  EngineOptions options() const {
    EngineOptions o;
    o.block_size = 4;  // many blocks per sequence: a leak shows
    return o;
  }
  std::vector<GenerationRequest> requests() const {
    std::vector<GenerationRequest> rs;
    for (const char* text : {"the cat sat on the mat", "once upon a time", "a b c d e f", "the dog ran"})
      rs.push_back(greedy_request(tokenizer_->encode(text, false), kTokens));
    return rs;
  }
  // The quiet run: the same requests, nothing failing.
  std::vector<Result> quiet() const {
    Engine engine(*model_, *tokenizer_, options());
    return run_all(engine, requests());
  }
  static void expect_blocks_returned(Engine& engine) {
    wait_idle(engine);
    const EngineMetrics m = engine.metrics();
    EXPECT_EQ(m.running, 0);
    EXPECT_EQ(m.kv_blocks_used, 0);
    EXPECT_EQ(m.kv_tokens_stored, 0);
    EXPECT_EQ(m.kv_blocks_free + m.kv_blocks_cached, m.kv_blocks_total);
  }
  // The faulty request (index 1) ends with an error naming the cause, after
  // a prefix of its quiet tokens; the other three give their quiet tokens;
  // every block comes back; the engine then serves the quiet run again.
  void expect_isolated(Engine& engine, const std::vector<Result>& got, const std::vector<Result>& want,
                       const std::string& cause) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (i == 1) {
        for (size_t b = 0; b < got[i].tokens.size(); ++b) {
          EXPECT_EQ(got[i].finish_reasons[b], "error") << "sequence " << b;
          EXPECT_NE(got[i].errors[b].find(cause), std::string::npos) << got[i].errors[b];
          const auto& quiet_tokens = want[i].tokens[0];  // greedy: every sequence draws them
          ASSERT_LE(got[i].tokens[b].size(), quiet_tokens.size());
          EXPECT_TRUE(std::equal(got[i].tokens[b].begin(), got[i].tokens[b].end(), quiet_tokens.begin()));
        }
        continue;
      }
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
      EXPECT_EQ(got[i].finish_reasons[0], "length") << "request " << i;
    }
    expect_blocks_returned(engine);
    const std::vector<Result> again = run_all(engine, requests());
    for (size_t i = 0; i < again.size(); ++i) EXPECT_EQ(again[i].tokens, want[i].tokens) << "after: request " << i;
    expect_blocks_returned(engine);
  }
};

struct Fault {
  const char* name;
  FaultAt at;
  int32_t n;  // the faulty request's sequences
  SpeculativeMode speculation;
  const char* cause;
};

class RequestIsolationFaults : public RequestIsolation, public ::testing::WithParamInterface<Fault> {};

}  // namespace

TEST_P(RequestIsolationFaults, OneRequestFailsAloneAndTheBatchGoesOn) {
  const Fault f = GetParam();
  const std::vector<Result> want = quiet();
  std::vector<GenerationRequest> rs = requests();
  rs[1].constraint = std::make_shared<FaultyConstraint>(f.at, 5);
  rs[1].n = f.n;
  rs[1].speculation.mode = f.speculation;
  Engine engine(*model_, *tokenizer_, options());
  const std::vector<Result> got = run_all(engine, rs);
  if (f.at == FaultAt::kAccept && f.n == 1 && f.speculation == SpeculativeMode::kNone) {
    EXPECT_EQ(got[1].tokens[0].size(), 5u);  // five accepted tokens went out; the sixth failed
  }
  expect_isolated(engine, got, want, f.cause);
}

INSTANTIATE_TEST_SUITE_P(
    Stages, RequestIsolationFaults,
    ::testing::Values(Fault{"Admission", FaultAt::kNewMatcher, 1, SpeculativeMode::kNone, "no matcher"},
                      Fault{"AdmissionOfBranches", FaultAt::kNewMatcher, 3, SpeculativeMode::kNone, "no matcher"},
                      Fault{"Mask", FaultAt::kMask, 1, SpeculativeMode::kNone, "in mask"},
                      Fault{"Accept", FaultAt::kAccept, 1, SpeculativeMode::kNone, "in accept"},
                      Fault{"AcceptWithThreeBranches", FaultAt::kAccept, 3, SpeculativeMode::kNone, "in accept"},
                      Fault{"AcceptWhileDrafting", FaultAt::kAccept, 1, SpeculativeMode::kNgram, "in accept"},
                      Fault{"RollbackWhileDrafting", FaultAt::kRollback, 1, SpeculativeMode::kNgram, "in rollback"}),
    [](const ::testing::TestParamInfo<Fault>& info) { return std::string(info.param.name); });

TEST_F(RequestIsolation, AnEventCallbackThatThrowsEndsItsRequestAlone) {
  const std::vector<Result> want = quiet();
  Engine engine(*model_, *tokenizer_, options());
  const std::vector<Result> got = run_all(engine, requests(), /*throw_on_event=*/1);
  expect_isolated(engine, got, want, "in the event callback");
}

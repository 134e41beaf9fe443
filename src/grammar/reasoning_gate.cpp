#include "grammar/reasoning_gate.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <string_view>
#include <utility>

#include "tokenizer/tokenizer.h"

namespace kvserve {
namespace {

// Whitespace tokens let through between the end tag and the answer's
// constraint (Qwen3 writes "\n\n"; a JSON grammar need not accept it).
constexpr int32_t kWhitespaceBeforeAnswer = 4;
// Tokens let through past the budget to finish a UTF-8 character in progress.
constexpr int32_t kUtf8Completion = 4;
// Bytes of the thinking kept to find the end tag across tokens.
constexpr size_t kTailSlack = 8;

bool is_whitespace_text(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

// Whether s ends inside a UTF-8 character (its lead byte came, not all the rest).
bool ends_mid_character(std::string_view s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return length > back;
  }
  return false;
}

class ReasoningGateMatcher final : public TokenMatcher {
 public:
  ReasoningGateMatcher(const ReasoningTags& tags, const Tokenizer& tokenizer, std::unique_ptr<TokenMatcher> inner,
                       ReasoningGateOptions options)
      : tags_(tags), tokenizer_(tokenizer), inner_(std::move(inner)), budget_(options.budget) {
    if (options.starts_in_reasoning) state_.phase = Phase::kThinking;
    else if (inner_ && tags_.start_id < 0) state_.phase = Phase::kAnswer;  // a several-token tag cannot be told apart from the answer's first tokens
    else state_.phase = Phase::kBefore;
  }

  void mask(std::span<float> logits) override;
  bool accept(int32_t token) override;
  void rollback(int32_t n) override;
  bool finished() override { return state_.phase == Phase::kAnswer && inner_ && inner_->finished(); }

 private:
  enum class Phase { kBefore, kThinking, kAnswerStart, kAnswer };
  struct State {
    Phase phase = Phase::kBefore;
    int64_t spent = 0;   // tokens inside the block
    size_t forced = 0;   // end tag tokens forced so far
    int32_t waited = 0;  // tokens let through past the budget to finish a character
    int32_t whitespace_left = kWhitespaceBeforeAnswer;
    std::string text;    // kBefore: the output after its leading whitespace; kThinking: its last bytes
  };
  struct Step {
    State before;
    bool fed_inner = false;
  };

  bool forcing() const {
    if (budget_ < 0 || state_.phase != Phase::kThinking || state_.spent < budget_ || tags_.end_ids.empty()) return false;
    return state_.forced > 0 || state_.waited >= kUtf8Completion || !ends_mid_character(state_.text);
  }
  Phase answer_phase() const { return inner_ ? Phase::kAnswerStart : Phase::kAnswer; }
  void mask_inner_beside(std::span<float> logits, std::span<const int32_t> allowed);
  bool accept_before(int32_t token, Step& step);
  bool accept_thinking(int32_t token);
  bool accept_answer(int32_t token, Step& step);
  void enter_thinking(std::string rest) {
    state_.phase = Phase::kThinking;
    state_.text = std::move(rest);
  }

  const ReasoningTags& tags_;
  const Tokenizer& tokenizer_;
  std::unique_ptr<TokenMatcher> inner_;
  int64_t budget_;
  State state_;
  std::vector<Step> history_;  // one per accepted token, for rollback
  std::vector<float> kept_;    // mask(): logits the inner constraint must not hide
};

// The inner constraint's mask, `allowed` ids left as they were beside it.
void ReasoningGateMatcher::mask_inner_beside(std::span<float> logits, std::span<const int32_t> allowed) {
  kept_.clear();
  for (int32_t id : allowed) kept_.push_back(logits[static_cast<size_t>(id)]);
  inner_->mask(logits);
  for (size_t i = 0; i < kept_.size(); ++i) logits[static_cast<size_t>(allowed[i])] = kept_[i];
}

void ReasoningGateMatcher::mask(std::span<float> logits) {
  switch (state_.phase) {
    case Phase::kBefore:
      if (inner_) mask_inner_beside(logits, std::span(&tags_.start_id, 1));  // the answer's first token, or the start tag
      return;
    case Phase::kThinking:
      if (forcing()) {
        const auto next = static_cast<size_t>(tags_.end_ids[state_.forced]);
        const float value = std::isfinite(logits[next]) ? logits[next] : 0.0f;
        std::fill(logits.begin(), logits.end(), -INFINITY);
        logits[next] = value;
      }
      return;
    case Phase::kAnswerStart:
      mask_inner_beside(logits, state_.whitespace_left > 0 ? std::span<const int32_t>(tags_.whitespace_ids)
                                                           : std::span<const int32_t>());
      return;
    case Phase::kAnswer:
      if (inner_) inner_->mask(logits);
      return;
  }
}

bool ReasoningGateMatcher::accept(int32_t token) {
  history_.push_back({state_, false});
  Step& step = history_.back();
  bool accepted = true;
  switch (state_.phase) {
    case Phase::kBefore: accepted = accept_before(token, step); break;
    case Phase::kThinking: accepted = accept_thinking(token); break;
    case Phase::kAnswerStart:
    case Phase::kAnswer: accepted = accept_answer(token, step); break;
  }
  if (!accepted) {
    state_ = std::move(history_.back().before);
    history_.pop_back();
  }
  return accepted;
}

bool ReasoningGateMatcher::accept_before(int32_t token, Step& step) {
  if (inner_) {
    if (token == tags_.start_id) {
      enter_thinking({});
      return true;
    }
    state_.phase = Phase::kAnswer;
    return accept_answer(token, step);
  }
  // No constraint: the start tag is found in the text, whichever tokens spell it.
  state_.text += token == tags_.start_id ? tags_.start : tokenizer_.token_bytes(token);
  const size_t first = state_.text.find_first_not_of(" \t\r\n");
  state_.text.erase(0, first == std::string::npos ? state_.text.size() : first);
  if (state_.text.starts_with(tags_.start)) enter_thinking(state_.text.substr(tags_.start.size()));
  else if (!std::string_view(tags_.start).starts_with(state_.text)) state_.phase = Phase::kAnswer;
  return true;
}

bool ReasoningGateMatcher::accept_thinking(int32_t token) {
  if (forcing()) {
    if (token != tags_.end_ids[state_.forced]) return false;
    state_.forced++;
  } else if (budget_ >= 0 && state_.spent >= budget_) {
    state_.waited++;
  }
  state_.spent++;
  const bool end_token = tags_.end_ids.size() == 1 && token == tags_.end_ids[0];
  state_.text += end_token ? tags_.end : tokenizer_.token_bytes(token);
  if (end_token || state_.text.find(tags_.end) != std::string::npos ||
      (state_.forced > 0 && state_.forced == tags_.end_ids.size())) {
    state_.phase = answer_phase();
    state_.text.clear();
    return true;
  }
  const size_t keep = tags_.end.size() + kTailSlack;
  if (state_.text.size() > keep) state_.text.erase(0, state_.text.size() - keep);
  return true;
}

bool ReasoningGateMatcher::accept_answer(int32_t token, Step& step) {
  if (!inner_) {
    state_.phase = Phase::kAnswer;
    return true;
  }
  if (state_.phase == Phase::kAnswerStart && state_.whitespace_left > 0 &&
      std::binary_search(tags_.whitespace_ids.begin(), tags_.whitespace_ids.end(), token)) {
    state_.whitespace_left--;
    return true;
  }
  if (!inner_->accept(token)) return false;
  step.fed_inner = true;
  state_.phase = Phase::kAnswer;
  return true;
}

void ReasoningGateMatcher::rollback(int32_t n) {
  int32_t fed = 0;
  for (int32_t i = 0; i < n && !history_.empty(); ++i) {
    fed += history_.back().fed_inner ? 1 : 0;
    state_ = std::move(history_.back().before);
    history_.pop_back();
  }
  if (fed > 0) inner_->rollback(fed);
}

class ReasoningGate final : public CompiledConstraint {
 public:
  ReasoningGate(const ReasoningTags& tags, const Tokenizer& tokenizer, std::shared_ptr<const CompiledConstraint> inner,
                ReasoningGateOptions options)
      : tags_(tags), tokenizer_(tokenizer), inner_(std::move(inner)), options_(options) {}
  std::unique_ptr<TokenMatcher> new_matcher() const override {
    return std::make_unique<ReasoningGateMatcher>(tags_, tokenizer_, inner_ ? inner_->new_matcher() : nullptr, options_);
  }
  size_t memory_bytes() const override { return sizeof(*this) + (inner_ ? inner_->memory_bytes() : 0); }

 private:
  const ReasoningTags& tags_;
  const Tokenizer& tokenizer_;
  std::shared_ptr<const CompiledConstraint> inner_;
  ReasoningGateOptions options_;
};

}  // namespace

ReasoningTags ReasoningTags::of(const Tokenizer& tokenizer, std::string start, std::string end) {
  ReasoningTags tags;
  const std::vector<int32_t> start_ids = tokenizer.encode(start, false, true);
  if (start_ids.size() == 1) tags.start_id = start_ids[0];
  tags.end_ids = tokenizer.encode(end, false, true);
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (is_whitespace_text(tokenizer.token_bytes(id))) tags.whitespace_ids.push_back(id);
  tags.start = std::move(start);
  tags.end = std::move(end);
  return tags;
}

std::shared_ptr<const CompiledConstraint> gate_after_reasoning(const ReasoningTags& tags, const Tokenizer& tokenizer,
                                                               std::shared_ptr<const CompiledConstraint> inner,
                                                               ReasoningGateOptions options) {
  return std::make_shared<ReasoningGate>(tags, tokenizer, std::move(inner), options);
}

}  // namespace kvserve

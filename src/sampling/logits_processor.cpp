#include "sampling/logits_processor.h"

#include <algorithm>
#include <limits>

namespace kvserve {

void LogitBias::process(std::span<float> row, int64_t) {
  for (const auto& [token, bias] : bias_) row[static_cast<size_t>(token)] += bias;
}

void MinTokensMask::process(std::span<float> row, int64_t generated) {
  if (!changes(generated)) return;
  for (int32_t token : ending_) row[static_cast<size_t>(token)] = -std::numeric_limits<float>::infinity();
}

void LogitsProcessorChain::add_constraint(TokenMatcher& matcher) {
  add(std::make_unique<ConstraintMask>(matcher));
  matcher_ = &matcher;
}

bool LogitsProcessorChain::changes(int64_t generated) const {
  return std::any_of(processors_.begin(), processors_.end(), [&](const auto& p) { return p->changes(generated); });
}

void LogitsProcessorChain::process(std::span<float> row, int64_t generated) {
  for (const auto& p : processors_) p->process(row, generated);
}

void LogitsProcessorChain::process_rows(std::span<float> rows, size_t vocab, std::span<const int32_t> drafts,
                                        int64_t generated) {
  int32_t accepted = 0;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    process(rows.subspan(i * vocab, vocab), generated + static_cast<int64_t>(i));
    if (i == drafts.size() || (matcher_ && !matcher_->accept(drafts[i]))) break;
    accepted++;
    // A draft that completes the output ends the sequence if it is accepted, so no row after it is used; a
    // matcher past its end-of-generation token must not be asked for a mask (xgrammar throws).
    if (matcher_ && matcher_->finished()) break;
  }
  if (matcher_) matcher_->rollback(accepted);
}

}  // namespace kvserve

#include "engine/stop_strings.h"

#include <algorithm>

namespace kvserve {

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (s.empty()) continue;
    Pattern p{std::move(s), {}};
    p.fallback.assign(p.text.size(), 0);
    for (size_t i = 1, k = 0; i < p.text.size(); ++i) {
      while (k > 0 && p.text[i] != p.text[k]) k = p.fallback[k - 1];
      if (p.text[i] == p.text[k]) ++k;
      p.fallback[i] = static_cast<uint32_t>(k);
    }
    patterns_.push_back(std::move(p));
  }
}

StopStringMatcher::StopStringMatcher(std::shared_ptr<const StopStrings> stops)
    : stops_(std::move(stops)), matched_(stops_->patterns_.size(), 0) {}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops)
    : StopStringMatcher(std::make_shared<const StopStrings>(std::move(stops))) {}

std::string StopStringMatcher::push(const std::string& text) {
  if (stopped_) return "";
  const size_t scanned = pending_.size();  // the held-back bytes: every automaton has seen them
  pending_ += text;
  size_t first = std::string::npos;  // where the earliest complete stop starts in pending_
  size_t keep = 0;                   // the longest prefix of a stop that ends pending_
  int64_t steps = 0;
  for (size_t i = 0; i < stops_->patterns_.size(); ++i) {
    const StopStrings::Pattern& p = stops_->patterns_[i];
    size_t m = matched_[i];
    for (size_t at = scanned; at < pending_.size(); ++at) {
      const char c = pending_[at];
      while (m > 0 && c != p.text[m]) {
        m = p.fallback[m - 1];
        ++steps;
      }
      ++steps;
      if (c == p.text[m] && ++m == p.text.size()) {
        // Its first occurrence; it starts inside pending_, as the prefix held back covered every earlier start.
        if (at + 1 - m < first) {
          first = at + 1 - m;
          matched_stop_ = i;
        }
        break;
      }
    }
    matched_[i] = static_cast<uint32_t>(m);
    keep = std::max(keep, m);
  }
  steps_ += steps;
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StopStringMatcher::matched() const {
  return stopped_ ? stops_->patterns_[matched_stop_].text : "";
}

std::string StopStringMatcher::flush() {
  std::string out;
  if (stopped_) return out;
  out.swap(pending_);
  std::fill(matched_.begin(), matched_.end(), 0);
  return out;
}

}  // namespace kvserve

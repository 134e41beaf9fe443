#include "loadgen/workload.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <string_view>
#include <unordered_map>

#include "core/error.h"

namespace kvserve::loadgen {
namespace {

// Common English words: most are one token in a byte-level BPE vocabulary of
// an English model, so the word-count approximation is close there.
constexpr std::array<std::string_view, 96> kWords = {
    "the",   "of",    "and",   "to",    "in",    "is",    "was",   "that",  "for",   "on",    "are",   "with",
    "as",    "at",    "be",    "this",  "have",  "from",  "or",    "one",   "had",   "by",    "word",  "but",
    "not",   "what",  "all",   "were",  "we",    "when",  "your",  "can",   "said",  "there", "use",   "an",
    "each",  "which", "she",   "do",    "how",   "their", "if",    "will",  "up",    "other", "about", "out",
    "many",  "then",  "them",  "these", "so",    "some",  "her",   "would", "make",  "like",  "him",   "into",
    "time",  "has",   "look",  "two",   "more",  "write", "go",    "see",   "number", "no",   "way",   "could",
    "people", "my",   "than",  "first", "water", "been",  "call",  "who",   "oil",   "its",   "now",   "find",
    "long",  "down",  "day",   "did",   "get",   "come",  "made",  "may",   "part",  "over",  "new",   "sound",
};

int64_t log_uniform(std::mt19937_64& rng, int64_t max) {
  const double lo = std::log(std::max<double>(1.0, static_cast<double>(max) / 16.0));
  const double hi = std::log(static_cast<double>(std::max<int64_t>(max, 1)));
  return std::max<int64_t>(1, static_cast<int64_t>(std::exp(std::uniform_real_distribution<double>(lo, hi)(rng))));
}

// Appends random words to a text until they make about `tokens` tokens.
class TextBuilder {
 public:
  TextBuilder(const Tokenizer* tokenizer, uint64_t seed) : tokenizer_(tokenizer), rng_(seed) {}

  // Returns the tokens the appended words count (their sum, per word).
  int64_t append(std::string& text, int64_t tokens) {
    std::uniform_int_distribution<size_t> pick(0, kWords.size() - 1);
    int64_t added = 0;
    while (added < tokens) {
      const size_t w = pick(rng_);
      if (!text.empty()) text += ' ';
      text += kWords[w];
      added += word_tokens(w);
    }
    return added;
  }

 private:
  // Tokens of " word" (a word after a space, as all but the first are); at least 1.
  int64_t word_tokens(size_t w) {
    if (!tokenizer_) return 1;
    auto it = counts_.find(w);
    if (it != counts_.end()) return it->second;
    const auto n = static_cast<int64_t>(tokenizer_->encode(" " + std::string(kWords[w]), false).size());
    return counts_[w] = std::max<int64_t>(1, n);
  }

  const Tokenizer* tokenizer_;
  std::mt19937_64 rng_;
  std::unordered_map<size_t, int64_t> counts_;
};

void validate(const WorkloadOptions& o) {
  if (o.requests <= 0) throw Error("--requests must be positive, got " + std::to_string(o.requests));
  if (o.max_prompt <= 0 || o.max_output <= 0) throw Error("-p and -n must be positive");
  if (o.shared_prefix < 0) throw Error("--shared-prefix must be >= 0, got " + std::to_string(o.shared_prefix));
  if (o.prefix_groups < 1) throw Error("--prefix-groups must be >= 1, got " + std::to_string(o.prefix_groups));
  if (!(o.request_rate >= 0)) throw Error("--request-rate must be >= 0 (0: all at once)");
}

}  // namespace

std::vector<WorkItem> make_workload(const WorkloadOptions& o, const Tokenizer* tokenizer) {
  validate(o);
  // Arrivals and lengths from one generator, words from another: the same
  // seed gives the same arrivals and lengths with or without a tokenizer.
  std::mt19937_64 rng(o.seed);
  TextBuilder words(tokenizer, o.seed ^ 0x9e3779b97f4a7c15ull);
  std::vector<std::string> system_prompts(o.prefix_groups);
  std::vector<int64_t> system_words(o.prefix_groups);
  for (int g = 0; g < o.prefix_groups; ++g) system_words[g] = words.append(system_prompts[g], o.shared_prefix);
  // Groups from a generator of their own: one group leaves the arrivals, lengths and words as they were.
  std::mt19937_64 group_rng(o.seed ^ 0x2545f4914f6cdd1dull);
  std::uniform_int_distribution<int> pick_group(0, o.prefix_groups - 1);
  std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
  std::vector<WorkItem> items;
  double t = 0;
  for (int i = 0; i < o.requests; ++i) {
    WorkItem w;
    if (o.request_rate > 0) t += gap(rng);
    w.arrival_s = t;
    const int g = o.prefix_groups > 1 ? pick_group(group_rng) : 0;
    w.prompt = system_prompts[g];
    const int64_t own = words.append(w.prompt, log_uniform(rng, o.max_prompt));
    w.output_tokens = log_uniform(rng, o.max_output);
    if (tokenizer) w.prompt_ids = tokenizer->encode(w.prompt, tokenizer->add_bos());
    w.prompt_tokens = tokenizer ? static_cast<int64_t>(w.prompt_ids.size()) : system_words[g] + own;
    items.push_back(std::move(w));
  }
  return items;
}

WorkloadTotals totals_of(const std::vector<WorkItem>& items) {
  WorkloadTotals t;
  for (const WorkItem& w : items) {
    t.prompt_tokens += w.prompt_tokens;
    t.output_tokens += w.output_tokens;
  }
  return t;
}

std::string describe_workload(const WorkloadOptions& o, const std::vector<WorkItem>& items, int concurrency) {
  const WorkloadTotals t = totals_of(items);
  char line[256];
  std::snprintf(line, sizeof line,
                "%d requests, rate %s/s, concurrency %d | prompt tokens %lld (shared prefix %lld%s), output %lld",
                o.requests, o.request_rate > 0 ? std::to_string(o.request_rate).c_str() : "inf", concurrency,
                static_cast<long long>(t.prompt_tokens), static_cast<long long>(o.shared_prefix),
                o.prefix_groups > 1 ? (" in " + std::to_string(o.prefix_groups) + " groups").c_str() : "",
                static_cast<long long>(t.output_tokens));
  return line;
}

}  // namespace kvserve::loadgen

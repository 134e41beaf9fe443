#pragma once
// Prompt-lookup drafting (no draft model): if the last n tokens already
// occurred earlier in prompt + generated text, propose what followed their
// latest occurrence. Tries n = max_ngram down to 1. Pays off when the output
// repeats its input (code edits, quoting, summaries, structured text) or
// loops (a match overlapping the last n tokens repeats its period); costs
// nothing but a scan when it does not. Deterministic, so its q is one-hot.
#include <cstdint>
#include <span>

#include "speculation/drafter.h"

namespace kvserve {

class NgramDrafter : public Drafter {
 public:
  // Throws kvserve::Error unless max_ngram >= 1.
  explicit NgramDrafter(int64_t max_ngram = 3);
  void propose(std::span<const int32_t> history, int64_t k, Sampler& sampler, DraftProposal& out) override;
  void commit(std::span<const int32_t>) override {}  // stateless: history is all it needs
  const char* name() const override { return "ngram"; }
  // The n of the last proposal's match (0: none). Longer matches predict
  // better: auto speculation keeps an acceptance estimate per n.
  int64_t last_match() const { return last_match_; }
  int64_t max_ngram() const { return max_ngram_; }

 private:
  int64_t max_ngram_;
  int64_t last_match_ = 0;
};

// Where the continuation of the latest earlier occurrence of history's last n
// tokens starts, or -1 when there is none. Linear in history: fine for the
// contexts a CPU decodes; a long-context server would keep an n-gram index.
int64_t find_ngram_continuation(std::span<const int32_t> history, int64_t n);

}  // namespace kvserve

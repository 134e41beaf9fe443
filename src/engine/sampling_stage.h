#pragma once
// The engine step's last stage: after the forward pass, each sampling
// chunk's rows of logits (the stage's to change) become tokens and events,
// and a prompt's rows its prompt logprobs when the request asks for them.
// A row is processed in place by its sequence's logits processors
// (sampling/logits_processor.h) and sampled, or a speculative chunk's drafts
// are verified against its rows and the rejected ones rolled back; each
// token then goes through the OutputProcessor (logprobs, grammar, text,
// stop conditions) into its sequence's event. A request with n > 1 forks
// into its n sequences at its first logits, each sampling from them.
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "engine/output_processor.h"
#include "engine/request_table.h"
#include "engine/scheduler.h"
#include "speculation/draft_verification.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

class SamplingStage {
 public:
  // `counters`: the engine's, where speculation rounds are counted.
  SamplingStage(RequestTable& requests, Scheduler& scheduler, const Tokenizer& tokenizer, int64_t vocab_size,
                EngineMetrics& counters);

  // `logits`: [rows][vocab], chunk i of `out` owning rows [first_row[i], first_row[i + 1])
  // (ScheduledChunk::logit_rows(): the sampling row and one per draft last).
  void run(const SchedulerOutput& out, std::span<float> logits, std::span<const int64_t> first_row);

  // Generated tokens taken so far (those a constraint rejected excluded).
  int64_t tokens_taken() const { return output_.tokens_taken(); }

 private:
  void score_prompt(RequestState& rs, Sequence& seq, int64_t start, std::span<const float> rows);
  void on_logits(Sequence& seq, std::span<float> row);
  void sample(RequestId id, RequestState& rs, SequenceState& state, Sequence& seq, std::span<float> row);
  void on_draft_logits(Sequence& seq, int64_t n_draft, std::span<float> rows);

  RequestTable& requests_;
  Scheduler& scheduler_;
  size_t vocab_;
  EngineMetrics& counters_;
  OutputProcessor output_;          // logprobs, text, stop conditions of each generated token
  std::vector<float> fork_row_;     // [vocab] a copy of a forking request's first row, for one sequence
  VerifyScratch verify_scratch_;    // speculative verification's [vocab] rows
  std::vector<int32_t> produced_;   // a verified round's tokens
};

}  // namespace kvserve

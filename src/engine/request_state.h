#pragma once
// A running request's per-sequence sampling and text state, as the engine
// thread keeps it (the scheduler's Sequence holds the tokens). A request with
// n > 1 has n sequences: the prompt is prefilled once by sequence 0, which is
// then forked (shared blocks, copy-on-write) into sequences 1..n-1; sequence
// i samples with seed + i, the stream a lone request with that seed would
// draw, so sequence i's tokens equal such a request's.
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "engine/stop_strings.h"
#include "kv/kv_cache_manager.h"
#include "sampling/logits_processor.h"
#include "sampling/sampler.h"
#include "speculation/request_speculation.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

constexpr SequenceId kNoSequence = 0;  // a sequence not forked yet

// Sequence `index` of a request: how it samples, and the text and constraint state of its output.
struct SequenceState {
  SequenceState(const GenerationRequest& r, int32_t index, const Tokenizer& tokenizer,
                const SpeculationContext& speculation, std::shared_ptr<const StopStrings> stop_strings,
                std::span<const int32_t> end_of_generation_ids)
      : index(index), sampler(seeded(r.sampling, index)), stream(tokenizer), stops(std::move(stop_strings)),
        spec(r.speculation, speculation),
        matcher(r.constraint ? r.constraint->new_matcher() : nullptr) {
    build_logits_processors(r, end_of_generation_ids);
  }
  static SamplingParams seeded(SamplingParams p, int32_t index) {
    p.seed += static_cast<uint64_t>(index);
    return p;
  }
  // logit_bias, then min_tokens' mask of the ids that would end the sequence, then the constraint's mask.
  void build_logits_processors(const GenerationRequest& r, std::span<const int32_t> end_of_generation_ids) {
    if (!r.logit_bias.empty()) logits.add(std::make_unique<LogitBias>(r.logit_bias));
    if (r.min_tokens > 0) {
      std::vector<int32_t> ending(end_of_generation_ids.begin(), end_of_generation_ids.end());
      ending.insert(ending.end(), r.stop_token_ids.begin(), r.stop_token_ids.end());
      logits.add(std::make_unique<MinTokensMask>(r.min_tokens, std::move(ending)));
    }
    if (matcher) logits.add_constraint(*matcher);
  }
  int32_t index;
  SequenceId seq_id = kNoSequence;  // the scheduler's Sequence
  Sampler sampler;
  TokenTextStream stream;
  StopStringMatcher stops;
  RequestSpeculation spec;  // this sequence's drafter (its own draft KV cache in draft-model mode) and adaptive k
  std::unique_ptr<TokenMatcher> matcher;  // the request's constraint over this sequence's output; null: free
  LogitsProcessorChain logits;  // what adjusts this sequence's logits before sampling (none: sampled as they are)
  int64_t completion_tokens = 0;
  bool finished = false;
};

struct RequestState {
  RequestState(GenerationRequest r, EventCallback callback, const Tokenizer& tokenizer,
               const SpeculationContext& speculation, std::span<const int32_t> end_of_generation_ids)
      : request(std::move(r)), on_event(std::move(callback)), unfinished(request.n) {
    const auto stops = std::make_shared<const StopStrings>(request.stop);  // compiled once for every sequence
    for (int32_t i = 0; i < request.n; ++i)
      sequences.push_back(
          std::make_unique<SequenceState>(request, i, tokenizer, speculation, stops, end_of_generation_ids));
  }
  GenerationRequest request;
  EventCallback on_event;
  std::vector<std::unique_ptr<SequenceState>> sequences;  // [n], sequence i at i
  int32_t unfinished;
  bool forked = false;  // sequences 1..n-1 are forked from sequence 0
  int64_t cached_tokens = 0;  // prompt tokens found in the prefix cache
  std::vector<TokenLogprob> prompt_logprobs;  // request.prompt_logprobs: prompt positions 1.. scored so far
};

}  // namespace kvserve

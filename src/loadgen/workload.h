#pragma once
// The serving benchmark's synthetic workload, shared by the in-process engine
// run and the remote (HTTP) run so that both replay the same requests: Poisson
// arrivals (or all at once), prompt and output lengths drawn log-uniformly
// over [max/16, max], and an optional system prompt shared by every request.
//
// Prompts are text (a remote server tokenizes them itself), built from a list
// of common English words. With prefix_groups > 1 there are that many system
// prompts and each request draws one (the workload of a router that should
// keep each group on one replica, docs/scaling.md). With a tokenizer their lengths are measured exactly
// (and their token ids kept for the in-process engine); without one a word is
// counted as one token, an approximation.
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvserve::loadgen {

struct WorkloadOptions {
  int requests = 32;
  double request_rate = 0;     // Poisson arrivals per second (0: all at once)
  int64_t max_prompt = 512;    // prompt tokens (after the shared prefix) log-uniform in [max/16, max]
  int64_t max_output = 128;    // output tokens log-uniform in [max/16, max], generated exactly
  int64_t shared_prefix = 0;   // tokens of system prompt shared by every request (of a group)
  int prefix_groups = 1;       // distinct system prompts of shared_prefix tokens; each request draws one at random
  uint64_t seed = 1;
};

struct WorkItem {
  double arrival_s = 0;              // since the start of the run
  std::string prompt;                // the shared system prompt, then this request's own words
  std::vector<int32_t> prompt_ids;   // the prompt's tokens (BOS as the tokenizer adds it); empty without a tokenizer
  int64_t prompt_tokens = 0;         // prompt_ids.size(), or the word count without a tokenizer
  int64_t output_tokens = 0;         // tokens to generate
};

// Throws kvserve::Error for options that make no workload (no requests,
// negative lengths or rate). `tokenizer` may be null.
std::vector<WorkItem> make_workload(const WorkloadOptions& options, const Tokenizer* tokenizer);

struct WorkloadTotals {
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
};
WorkloadTotals totals_of(const std::vector<WorkItem>& items);

// One line describing the workload, for the top of a report:
// "32 requests, rate inf/s, concurrency 8 | prompt tokens 4012 (shared prefix 0), output 1650".
std::string describe_workload(const WorkloadOptions& options, const std::vector<WorkItem>& items, int concurrency);

}  // namespace kvserve::loadgen

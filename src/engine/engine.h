#pragma once
// The serving engine's public boundary: requests go in from any thread,
// token events come out through a callback. Front ends (the HTTP server,
// `kvserve run -f`, benchmarks) see only this header.
//
// Thread-safety: every public method may be called from any thread. Event
// callbacks run on the engine's own thread, one at a time; they must return
// quickly (copy the event, signal a condition variable) and must not call
// back into the engine except cancel().
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/kv_type.h"
#include "parallel/pipeline_options.h"
#include "sampling/sampler.h"
#include "speculation/speculation_settings.h"

namespace kvserve {

// Used here only by pointer or reference: their users include them.
class CompiledConstraint;  // grammar/token_constraint.h
class Model;               // model/model.h
struct ModelConfig;        // model/config.h
class Tokenizer;           // tokenizer/tokenizer.h
struct RequestLimits;      // engine/request_validation.h
class ValidatedRequest;    // engine/request_validation.h

using RequestId = uint64_t;

struct GenerationRequest {
  std::vector<int32_t> prompt;     // token ids, chat template already applied
  SamplingParams sampling;
  int64_t max_tokens = 128;        // generated tokens at most
  std::vector<std::string> stop;   // stop strings; matched on the decoded text, not included in it
  bool ignore_eos = false;
  int32_t top_logprobs = -1;       // -1: no logprobs; 0: the chosen token's only; k: plus the k most likely
  // The prompt's own logprobs (OpenAI's echo + logprobs, vLLM's prompt_logprobs): each prompt token after
  // the first, from the logits of the tokens before it. -1: none; 0: the token's; k: plus the k most likely.
  // Every prompt position is computed (a prefix-cache hit never covers one not scored yet), and with
  // max_tokens 0 the prompt is still prefilled, then the request ends with "length".
  int32_t prompt_logprobs = -1;
  int32_t n = 1;                   // parallel samples (sequences): the prompt is prefilled once and forked
                                   // n ways; sequence i samples with sampling.seed + i
  SpeculationSettings speculation;
  // What the output must follow (JSON schema, regex, grammar; null: free):
  // every sequence masks its logits with its own matcher, and ends with "stop"
  // when the constraint is complete. Logprobs report the masked distribution.
  std::shared_ptr<const CompiledConstraint> constraint;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, added to its logit) before sampling (OpenAI's logit_bias)
  std::vector<int32_t> stop_token_ids;  // generating one ends the sequence ("stop"); its text is kept
  int64_t min_tokens = 0;               // end-of-generation and stop_token_ids are masked until this many
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the top_logprobs most likely (id, logprob)
  int64_t rank = 0;  // prompt logprobs: 1 + the ids more likely than this one (vLLM's rank); 0 elsewhere
};

struct GenerationEvent {
  RequestId id = 0;
  int32_t index = 0;                  // the sequence in [0, n) of the request the event belongs to
  std::vector<int32_t> tokens;        // generated since the previous event
  std::string text;                   // text completed since the previous event (whole UTF-8 characters)
  std::vector<TokenLogprob> logprobs; // one per token, when requested
  // GenerationRequest::prompt_logprobs: in each sequence's first event, one per
  // prompt token after the first (prompt position 1 on).
  std::vector<TokenLogprob> prompt_logprobs;
  bool finished = false;              // the sequence's last event; a request ends after n of them
  std::string finish_reason;          // when finished: "stop", "length", "cancelled" or "error"
  std::string stop_sequence;          // when a stop string ended it: that string
  // The message when finish_reason is "error": what threw in this request's
  // own processing (its constraint's matcher, sampling, text, stop strings,
  // logprobs, its callback), which ends it alone (every unfinished sequence)
  // while the other requests go on, or a failed forward pass, which ends all.
  std::string error;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;      // generated so far
  int64_t cached_tokens = 0;          // prompt tokens found in the prefix cache (not computed)
};

using EventCallback = std::function<void(const GenerationEvent&)>;

struct EngineOptions {
  int64_t max_context = 4096;       // tokens per sequence (prompt + generated)
  int64_t max_queue = 64;           // waiting requests before submit() refuses
  int64_t max_running = 16;         // sequences decoded together
  int64_t max_batch_tokens = 512;   // tokens per forward step (decode + chunked prefill)
  int64_t block_size = 16;          // KV block size in tokens
  int64_t kv_memory_bytes = 0;      // KV pool size; 0: room for max_running full contexts, at most 1 GiB
  KVType kv_type = KVType::F32;     // K/V element type in the pool (q8_0, fp8, q4_0 need head_dim % 32 == 0)
  int64_t kv_blocks = 0;            // KV pool size in blocks; overrides kv_memory_bytes when > 0
  bool prefix_caching = true;       // reuse cached full blocks of earlier prompts
  bool sliding_window_kv = true;    // models with sliding-window layers (Gemma 3): those layers' K/V in a pool of
                                    // their own that frees blocks every window has passed (false: every layer
                                    // keeps every position, as before; same logits either way)
  int threads = 0;                  // OpenMP threads of the engine thread's kernels; 0: the process default
                                    // (omp_set_num_threads in another thread does not reach the engine's)
  // The draft model of SpeculativeMode::kDraftModel requests (null: such
  // requests are refused). It must share the target's vocabulary and outlive
  // the engine. Its K/V live in a paged pool of their own with as many blocks
  // as the target's (counted in kv_memory_bytes), and the drafting sequences'
  // draft passes run batched (docs/speculative.md).
  const Model* draft_model = nullptr;
  // Auto speculation's step cost t(n), as (batch tokens, seconds) points. Empty:
  // measured by the engine (a few forward passes over a scratch sequence) at
  // start when measure_step_cost is set, else before the first auto request.
  // Given points keep their shape (measured ones learn it from the steps run).
  std::vector<std::pair<int64_t, double>> step_cost;
  bool measure_step_cost = false;
  // Auto speculation drafts only for an expected gain of at least this
  // (speculation_policy.h's kMinDraftGain; tests that must exercise drafting lower it).
  double spec_min_draft_gain = kMinDraftGain;
  // Pipeline parallelism (docs/scaling.md): with pipeline.comm set, the model
  // is rank 0's stage (ModelLoadOptions::pipeline_rank 0) and every forward
  // step continues on the other ranks, which run run_pipeline_stage(). The
  // communicator must outlive the engine. Their KV pools mirror this one, so
  // kv_memory_bytes budgets each rank for the layers it holds.
  PipelineOptions pipeline;
};

struct EngineMetrics {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_blocks_cached = 0;     // unreferenced blocks kept for prefix reuse
  // The sliding-window layers' own pool (EngineOptions::sliding_window_kv); 0 without one.
  int64_t kv_sliding_blocks_total = 0;
  int64_t kv_sliding_blocks_used = 0;
  int64_t kv_sliding_blocks_cached = 0;
  int64_t kv_blocks_used_peak = 0;          // the most blocks held at once since the start (after a step's planning)
  int64_t kv_sliding_blocks_used_peak = 0;  // same, sliding pool
  int64_t kv_bytes_used_peak = 0;           // the K/V bytes of the peak held blocks (both pools at their own peaks)
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;    // of which found there
  int64_t prompt_tokens_total = 0;  // prompt tokens computed
  int64_t generated_tokens_total = 0;
  int64_t requests_finished = 0;
  int64_t preemptions = 0;
  int64_t kv_tokens_stored = 0;     // K/V tokens held by running sequences
  int64_t kv_slots_allocated = 0;   // token slots in their blocks (stored / allocated = utilization)
  int64_t steps = 0;                // forward passes run
  int64_t spec_rounds = 0;          // speculative verifications (a sequence's token + drafts in one pass)
  int64_t spec_draft_tokens = 0;    // drafts proposed (and run through the target)
  int64_t spec_accepted_tokens = 0; // drafts accepted
  int64_t spec_draft_passes = 0;    // draft-model forward passes (each over every drafting sequence)
  int64_t draft_kv_blocks_total = 0; // the draft model's K/V pool (0 without a draft model)
  int64_t draft_kv_blocks_used = 0;
};

// The bytes of the K/V pools (the target's, and a draft model's with as many blocks) an Engine over a model of
// this config with these options allocates: the same formula the engine sizes its pools with (kv_pool_sizing.h).
// draft: the draft model's config (null: none; options.draft_model is not read). Throws kvserve::Error as the
// Engine's constructor would for options that cannot make a pool.
int64_t planned_kv_pool_bytes(const ModelConfig& config, const EngineOptions& options, const ModelConfig* draft);

class Engine {
 public:
  // The model and tokenizer must outlive the engine. Starts the engine thread.
  // Throws kvserve::Error when options.draft_model has another vocabulary or
  // options.step_cost has a point with n < 1 or a non-positive time.
  Engine(const Model& model, const Tokenizer& tokenizer, const EngineOptions& options);
  ~Engine();  // cancels what is left and joins the engine thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws kvserve::Error for one that can never run (empty
  // or too long prompt, bad sampling parameters, max_tokens < 0, n outside
  // [1, 128], draft-model speculation without a draft model, draft_k out of range); returns
  // nullopt when the waiting queue is full or the engine is shutting down.
  std::optional<RequestId> submit(GenerationRequest request, EventCallback on_event);
  // The same, for a request validated already (against request_limits(): a
  // request checked against other limits is checked again here).
  std::optional<RequestId> submit_validated(ValidatedRequest request, EventCallback on_event);
  // Stops a request (every sequence) at once and frees its KV memory; each
  // unfinished sequence's final event has finish_reason "cancelled". Unknown or finished ids are ignored.
  void cancel(RequestId id);
  EngineMetrics metrics() const;
  // Refuses new requests; finish_running lets the running and waiting ones
  // complete, otherwise they are cancelled. Returns when the engine is idle.
  void shutdown(bool finish_running);
  const EngineOptions& options() const;
  // What submit() checks requests against (engine/request_validation.h).
  const RequestLimits& request_limits() const;
  // Auto speculation's step cost t(n) as (tokens, seconds), when it was given
  // in the options or measured at start (EngineOptions::measure_step_cost);
  // empty otherwise.
  const std::vector<std::pair<int64_t, double>>& step_cost_at_start() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvserve

#pragma once
// The engine thread's running requests: each one's state (RequestState: its
// sequences' samplers, text, constraints, drafters) and which request and
// sequence each scheduled Sequence belongs to. How a request starts (its
// sequence 0 queued in the scheduler), forks into its n sequences, and ends:
// a sequence's final event frees its blocks at once, and the request is
// forgotten with its last sequence. What a request's own processing throws
// (for_request) is held until the step ends and then ends that request
// alone (finish_failures).
//
// Not thread-safe: owned by the engine thread.
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "decode/sequence.h"
#include "engine/engine.h"
#include "engine/finish_reason.h"
#include "engine/request_state.h"
#include "engine/scheduler.h"
#include "speculation/draft_model_batch.h"
#include "speculation/request_speculation.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

class RequestTable {
 public:
  // What the engine does around a request's last event: `finished` just
  // before it (count it and publish the metrics, so a client that reads them
  // after its final event sees its request finished and its blocks back),
  // `forgotten` after it (shutdown() may return once none is left).
  struct Hooks {
    std::function<void()> finished;
    std::function<void(RequestId)> forgotten;
  };

  // `draft`: the engine's draft model, whose K/V a finished sequence frees (null: none).
  RequestTable(const Tokenizer& tokenizer, int64_t vocab_size, Scheduler& scheduler, DraftModelBatch* draft,
               Hooks hooks);

  // Makes the request's state and queues its sequence 0 (at most
  // max_kv_tokens K/V slots); max_tokens 0 ends it at once. What throws here
  // (a matcher or drafter that cannot be made) fails that request alone.
  void start(RequestId id, GenerationRequest request, EventCallback on_event, const SpeculationContext& speculation,
             int64_t max_kv_tokens);
  // Ends a request whose state could not be made: each of its n sequences' final event carries the error.
  void refuse(RequestId id, int32_t n, const EventCallback& on_event, const std::string& error);

  // The request a scheduled sequence belongs to, and that sequence's state.
  struct Owner {
    RequestId id;
    RequestState& request;
    SequenceState& state;
  };
  Owner owner(const Sequence& seq);

  // Forks sequence 0 of request `id` (`seq`, its prompt computed) into
  // sequences 1..n-1 (shared blocks, copy-on-write); returns all n with their
  // scheduled Sequences, in order.
  std::vector<std::pair<SequenceState*, Sequence*>> fork(RequestId id, Sequence& seq);

  // An event of `state`'s sequence with the request's usage so far.
  GenerationEvent event(RequestId id, const SequenceState& state) const;
  // Sends the sequence's final event and frees its blocks at once; the
  // request is forgotten with its last sequence.
  void finish(RequestId id, SequenceState& state, GenerationEvent& ev, FinishReason reason);
  // Ends a sequence that has not finished yet with `reason` (and `error`).
  void finish_if_live(RequestId id, SequenceState& state, FinishReason reason, const std::string& error = "");
  // Ends every unfinished sequence of a request (cancel, error); unknown ids are ignored.
  void finish_all(RequestId id, FinishReason reason, const std::string& error = "");
  // Ends every request (a failed forward pass leaves the KV contents unknown).
  void finish_every(FinishReason reason, const std::string& error);

  // Runs one request's part of a step (its drafts, its logits processing,
  // sampling, verification, grammar, text, stop strings, logprobs, events).
  // What throws there fails that request alone: the failure is noted, the
  // rest of the step leaves the request out, and finish_failures() ends it
  // after the step; the other requests go on with the same tokens.
  template <class Work>
  void for_request(RequestId id, Work&& work) {
    try {
      work();
    } catch (const std::exception& e) {
      failures_.try_emplace(id, e.what());
    } catch (...) {
      failures_.try_emplace(id, "an unknown exception");
    }
  }
  bool failed(RequestId id) const { return failures_.count(id) > 0; }
  // Ends the requests that failed in this step: each unfinished sequence gets
  // finish_reason "error" with the cause, and their KV blocks go back.
  void finish_failures();

 private:
  SequenceId new_sequence(RequestId id, SequenceState& state);

  const Tokenizer& tokenizer_;
  Scheduler& scheduler_;
  DraftModelBatch* draft_;
  Hooks hooks_;
  std::vector<int32_t> end_of_generation_ids_;  // what min_tokens masks
  std::map<RequestId, RequestState> requests_;
  std::map<SequenceId, std::pair<RequestId, int32_t>> owners_;  // each sequence -> (request, its index there)
  std::map<RequestId, std::string> failures_;  // requests whose own processing threw this step, with the cause
  SequenceId next_seq_ = kNoSequence + 1;
};

}  // namespace kvserve

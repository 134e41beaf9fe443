#include "engine/request_table.h"

#include <algorithm>
#include <memory>

#include "core/error.h"

namespace kvserve {
namespace {

std::vector<int32_t> end_of_generation_ids(const Tokenizer& tokenizer, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < std::min(vocab, tokenizer.vocab_size()); ++id)
    if (tokenizer.is_end_of_generation(id)) ids.push_back(id);
  return ids;
}

}  // namespace

RequestTable::RequestTable(const Tokenizer& tokenizer, int64_t vocab_size, Scheduler& scheduler,
                           DraftModelBatch* draft, Hooks hooks)
    : tokenizer_(tokenizer), scheduler_(scheduler), draft_(draft), hooks_(std::move(hooks)),
      end_of_generation_ids_(end_of_generation_ids(tokenizer, static_cast<int32_t>(vocab_size))) {}

void RequestTable::start(RequestId id, GenerationRequest request, EventCallback on_event,
                         const SpeculationContext& speculation, int64_t max_kv_tokens) {
  const int32_t n = request.n;
  try {
    // The callback moves in last: refuse() needs it if the state cannot be made.
    auto [it, inserted] = requests_.try_emplace(id, std::move(request), EventCallback{}, tokenizer_, speculation,
                                               end_of_generation_ids_);
    check(inserted, "request ids are unique");
    RequestState& rs = it->second;
    rs.on_event = std::move(on_event);
    // max_tokens 0 ends a request at once, unless it asks for its prompt's logprobs.
    if (rs.request.max_tokens == 0 && rs.request.prompt_logprobs < 0) return finish_all(id, FinishReason::kLength);
    auto seq = std::make_unique<Sequence>();
    seq->id = new_sequence(id, *rs.sequences[0]);
    seq->tokens = rs.request.prompt;
    seq->prompt_len = static_cast<int64_t>(rs.request.prompt.size());
    seq->max_kv_tokens = max_kv_tokens;
    seq->scores_prompt = rs.request.prompt_logprobs >= 0;
    scheduler_.add(std::move(seq));
  } catch (const std::exception& e) {
    if (requests_.count(id) > 0) return finish_all(id, FinishReason::kError, e.what());
    refuse(id, n, on_event, e.what());
  }
}

void RequestTable::refuse(RequestId id, int32_t n, const EventCallback& on_event, const std::string& error) {
  hooks_.finished();
  for (int32_t i = 0; i < n && on_event; ++i) {
    GenerationEvent ev;
    ev.id = id;
    ev.index = i;
    ev.finished = true;
    ev.finish_reason = to_string(FinishReason::kError);
    ev.error = error;
    for_request(id, [&] { on_event(ev); });
  }
  hooks_.forgotten(id);
}

RequestTable::Owner RequestTable::owner(const Sequence& seq) {
  const auto [id, index] = owners_.at(seq.id);
  RequestState& rs = requests_.at(id);
  return {id, rs, *rs.sequences[static_cast<size_t>(index)]};
}

std::vector<std::pair<SequenceState*, Sequence*>> RequestTable::fork(RequestId id, Sequence& seq) {
  RequestState& rs = requests_.at(id);
  rs.forked = true;
  std::vector<std::pair<SequenceState*, Sequence*>> all = {{rs.sequences[0].get(), &seq}};
  for (size_t i = 1; i < rs.sequences.size(); ++i) {
    SequenceState& state = *rs.sequences[i];
    all.emplace_back(&state, scheduler_.fork(seq.id, new_sequence(id, state)));
  }
  return all;
}

SequenceId RequestTable::new_sequence(RequestId id, SequenceState& state) {
  state.seq_id = next_seq_++;
  owners_[state.seq_id] = {id, state.index};
  return state.seq_id;
}

GenerationEvent RequestTable::event(RequestId id, const SequenceState& state) const {
  const RequestState& rs = requests_.at(id);
  GenerationEvent ev;
  ev.id = id;
  ev.index = state.index;
  ev.prompt_tokens = static_cast<int64_t>(rs.request.prompt.size());
  ev.completion_tokens = state.completion_tokens;
  ev.cached_tokens = rs.cached_tokens;
  return ev;
}

void RequestTable::finish(RequestId id, SequenceState& state, GenerationEvent& ev, FinishReason reason) {
  scheduler_.remove(state.seq_id);
  owners_.erase(state.seq_id);
  if (draft_ != nullptr) draft_->release(state.seq_id);  // its draft K/V, at once (other sequences may run on)
  state.finished = true;
  ev.finished = true;
  ev.finish_reason = to_string(reason);
  const auto it = requests_.find(id);
  if (--it->second.unfinished > 0) return for_request(id, [&] { it->second.on_event(ev); });
  EventCallback callback = std::move(it->second.on_event);
  requests_.erase(it);
  hooks_.finished();  // before the final event: its blocks are back
  for_request(id, [&] { callback(ev); });
  hooks_.forgotten(id);
}

void RequestTable::finish_if_live(RequestId id, SequenceState& state, FinishReason reason, const std::string& error) {
  if (state.finished) return;
  GenerationEvent ev = event(id, state);
  ev.error = error;
  finish(id, state, ev, reason);
}

void RequestTable::finish_all(RequestId id, FinishReason reason, const std::string& error) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return;
  std::vector<SequenceState*> live;
  for (auto& state : it->second.sequences)
    if (!state->finished) live.push_back(state.get());
  for (SequenceState* state : live) finish_if_live(id, *state, reason, error);  // the last one erases the request
}

void RequestTable::finish_every(FinishReason reason, const std::string& error) {
  std::vector<RequestId> ids;
  for (const auto& [id, rs] : requests_) ids.push_back(id);
  for (RequestId id : ids) finish_all(id, reason, error);
}

void RequestTable::finish_failures() {
  std::map<RequestId, std::string> failed;
  failed.swap(failures_);
  for (const auto& [id, error] : failed) finish_all(id, FinishReason::kError, error);
}

}  // namespace kvserve

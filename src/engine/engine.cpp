// The Engine boundary over continuous batching. The engine thread loops:
// take new requests (admission builds each branch's state: sampler, logits
// processors, stop strings, drafter) and cancellations, run one step, publish
// the metrics. A step is, as the data flows:
//   schedule()         the Scheduler plans running decodes (with speculative
//                      drafts for requests that ask for them) + chunked
//                      prefills under the token budget;
//   run_draft_model()  the draft model's batched passes for those drafts;
//   forward()          one batched forward pass over the paged KV cache;
//   process_outputs()  where a chunk reached the end of its known tokens, its
//                      logits rows are processed in place (sampling/
//                      logits_processor.h), sampled or its drafts verified,
//                      and each token goes through the OutputProcessor
//                      (logprobs, text, stop conditions) into an event;
//                      finished branches free their sequences at once.
//
// State: the model and tokenizer are shared and const; KV memory is the
// KVCacheManager (metadata) + PagedKVStorage (bytes); per-request sampling
// and text state live in RequestState; only the inbox, the cancel set, the
// live-id set and the metrics snapshot are shared with other threads, under
// mutex_. Counters are kept on the engine thread and published once per
// loop iteration (and before a request's final event).
#include "engine/engine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"
#include "engine/finish_reason.h"
#include "engine/output_processor.h"
#include "engine/request_state.h"
#include "engine/request_validation.h"
#include "engine/scheduler.h"
#include "kernels/openmp_wait.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_pool_sizing.h"
#include "kv/paged_kv_storage.h"
#include "model/model.h"
#include "model/transformer.h"
#include "parallel/model_runner.h"
#include "parallel/pipeline_head.h"
#include "speculation/draft_stage.h"
#include "speculation/model_drafter.h"
#include "speculation/request_speculation.h"
#include "speculation/speculation_cost_probe.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {
namespace {

struct Pending {
  RequestId id;
  GenerationRequest request;
  EventCallback on_event;
};

std::vector<int32_t> end_of_generation_ids(const Tokenizer& tokenizer, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < std::min(vocab, tokenizer.vocab_size()); ++id)
    if (tokenizer.is_end_of_generation(id)) ids.push_back(id);
  return ids;
}

// The pools' sizes for this model and these options (kv/kv_pool_sizing.h).
KVPoolBlocks pool_blocks(const ModelConfig& c, const EngineOptions& o, int64_t context) {
  KVPoolRequest r;
  r.block_size = o.block_size;
  r.type = o.kv_type;
  r.context = context;
  r.sequences = o.max_running;
  r.chunk = o.max_batch_tokens;
  r.blocks = o.kv_blocks;
  r.memory_bytes = o.kv_memory_bytes;
  if (o.draft_model != nullptr && o.block_size > 0)
    r.extra_bytes_per_block = DraftModelBatch::bytes_per_block(o.draft_model->config(), o.block_size);
  // A pipeline's stages mirror one pool shape: its ranks keep every position (docs/scaling.md).
  r.sliding_group = o.sliding_window_kv && o.pipeline.comm == nullptr;
  return kv_pool_blocks(c.kv_shape(), r);
}

// Every layer here, or the first stage of a pipeline (the model is then rank 0's slice).
std::unique_ptr<ModelRunner> make_runner(const Model& model, const EngineOptions& o, const KVPoolBlocks& pools) {
  if (o.pipeline.comm == nullptr)
    return make_local_runner(model, make_kv_storage(model.config().kv_shape(), pools, o.block_size, o.kv_type));
  return make_pipeline_head(model, {pools.full, o.block_size, o.kv_type}, o.pipeline);
}

}  // namespace

class Engine::Impl {
 public:
  Impl(const Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
      : model_(model), tokenizer_(tokenizer), options_(options),
        pools_(pool_blocks(model.config(), options, std::min(options.max_context, model.config().context_length))),
        // The longest sequence must fit in the context and in the whole pool
        // (the sliding pool holds at least one sequence's window: pool_blocks).
        context_limit_(std::min({options.max_context, model.config().context_length, pools_.full * options.block_size})),
        kv_(make_kv_manager(model.config().kv_shape(), pools_, options.block_size, options.prefix_caching)),
        scheduler_(SchedulerConfig{options.max_running, options.max_batch_tokens}, kv_),
        runner_(make_runner(model, options, pools_)),
        draft_batch_(options.draft_model == nullptr
                         ? nullptr
                         : std::make_unique<DraftModelBatch>(*options.draft_model, pools_.full, options.block_size,
                                                             options.prefix_caching, options.max_batch_tokens)),
        thread_([this] { loop(); }) {
    publish_metrics();  // the pool size is known before the first request
  }

  ~Impl() {
    shutdown(false);
    thread_.join();
  }

  std::optional<RequestId> submit(GenerationRequest request, EventCallback on_event) {
    validate_request(request, limits_);
    std::lock_guard lock(mutex_);
    if (stopping_ || static_cast<int64_t>(inbox_.size()) + scheduler_waiting_ >= options_.max_queue) return std::nullopt;
    const RequestId id = next_id_++;
    inbox_.push_back({id, std::move(request), std::move(on_event)});
    live_.insert(id);
    wake_.notify_all();
    return id;
  }

  void cancel(RequestId id) {
    std::lock_guard lock(mutex_);
    if (live_.count(id) == 0) return;
    cancelled_.insert(id);
    wake_.notify_all();
  }

  EngineMetrics metrics() const {
    std::lock_guard lock(mutex_);
    EngineMetrics m = metrics_;
    m.waiting = scheduler_waiting_ + static_cast<int64_t>(inbox_.size());  // the inbox as it is now
    return m;
  }

  void shutdown(bool finish_running) {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    if (!finish_running) cancelled_.insert(live_.begin(), live_.end());
    wake_.notify_all();
    idle_.wait(lock, [this] { return live_.empty(); });
    exit_ = true;
    wake_.notify_all();
  }

  const EngineOptions& options() const { return options_; }
  const RequestLimits& request_limits() const { return limits_; }
  const std::vector<std::pair<int64_t, double>>& step_cost_at_start() const { return step_cost_at_start_; }

 private:
  void loop() {
    if (options_.threads > 0) omp_set_num_threads(options_.threads);
    for (;;) {
      std::vector<Pending> arrived;
      std::set<RequestId> cancels;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return exit_ || !inbox_.empty() || !cancelled_.empty() || !scheduler_.idle(); });
        if (exit_ && inbox_.empty() && scheduler_.idle()) return;
        arrived.assign(std::make_move_iterator(inbox_.begin()), std::make_move_iterator(inbox_.end()));
        inbox_.clear();
        cancels.swap(cancelled_);
      }
      for (Pending& p : arrived) admit(std::move(p));
      for (RequestId id : cancels) finish_cancelled(id);
      if (!scheduler_.idle()) step_or_fail();
      publish_metrics();
    }
  }

  // Takes a request in. What throws here (a matcher or drafter that cannot
  // be made) fails that request alone.
  void admit(Pending p) {
    const RequestId id = p.id;
    const int32_t n = p.request.n;
    try {
      start(p);
    } catch (const std::exception& e) {
      if (requests_.count(id) > 0) return finish_all(id, FinishReason::kError, e.what());
      refuse(id, n, p.on_event, e.what());
    }
  }

  // Makes the request's state (the callback moves in last: refuse() needs it
  // if the state cannot be made) and queues its first sequence.
  void start(Pending& p) {
    const RequestId id = p.id;
    const SpeculationContext speculation{draft_batch_.get(), &policy_};
    if (p.request.speculation.mode == SpeculativeMode::kAuto && !policy_.step_cost.measured()) cost_probe().measure(policy_);
    auto [it, inserted] = requests_.try_emplace(id, std::move(p.request), EventCallback{}, tokenizer_, speculation,
                                               end_of_generation_ids_);
    check(inserted, "request ids are unique");
    RequestState& rs = it->second;
    rs.on_event = std::move(p.on_event);
    if (rs.request.max_tokens == 0) return finish_all(id, FinishReason::kLength);
    auto seq = std::make_unique<Sequence>();
    seq->id = new_sequence(id, *rs.branches[0]);
    seq->tokens = rs.request.prompt;
    seq->prompt_len = static_cast<int64_t>(rs.request.prompt.size());
    seq->max_kv_tokens = context_limit_;
    scheduler_.add(std::move(seq));
  }

  // Ends a request whose state could not be made: every branch's final event carries the error.
  void refuse(RequestId id, int32_t n, const EventCallback& on_event, const std::string& error) {
    counters_.requests_finished++;
    publish_metrics();
    for (int32_t i = 0; i < n && on_event; ++i) {
      GenerationEvent ev;
      ev.id = id;
      ev.index = i;
      ev.finished = true;
      ev.finish_reason = to_string(FinishReason::kError);
      ev.error = error;
      for_request(id, [&] { on_event(ev); });
    }
    forget(id);
  }

  SequenceId new_sequence(RequestId id, Branch& b) {
    b.seq = next_seq_++;
    owners_[b.seq] = {id, b.index};
    return b.seq;
  }

  GenerationEvent base_event(RequestId id, const RequestState& rs, const Branch& b) const {
    GenerationEvent ev;
    ev.id = id;
    ev.index = b.index;
    ev.prompt_tokens = static_cast<int64_t>(rs.request.prompt.size());
    ev.completion_tokens = b.completion_tokens;
    ev.cached_tokens = rs.cached_tokens;
    return ev;
  }

  // Sends the branch's final event and frees its blocks at once; the request
  // is forgotten with its last branch.
  void finish(RequestId id, Branch& b, GenerationEvent& ev, FinishReason reason) {
    scheduler_.remove(b.seq);
    owners_.erase(b.seq);
    if (draft_batch_) draft_batch_->release(b.seq);  // its draft K/V, at once (other branches may run on)
    b.finished = true;
    ev.finished = true;
    ev.finish_reason = to_string(reason);
    const auto it = requests_.find(id);
    if (--it->second.unfinished > 0) return for_request(id, [&] { it->second.on_event(ev); });
    EventCallback callback = std::move(it->second.on_event);
    requests_.erase(it);
    // Counters first: a client that reads the metrics after its final event
    // must see its request finished and its blocks back in the pool.
    counters_.requests_finished++;
    publish_metrics();
    for_request(id, [&] { callback(ev); });
    forget(id);
  }

  // The request has sent its last event: shutdown() may return once none is left.
  void forget(RequestId id) {
    std::lock_guard lock(mutex_);
    live_.erase(id);
    if (live_.empty()) idle_.notify_all();
  }

  // Ends a branch that has not finished yet with `reason` (and `error`).
  void finish_if_live(RequestId id, Branch& b, FinishReason reason, const std::string& error = "") {
    if (b.finished) return;
    GenerationEvent ev = base_event(id, requests_.at(id), b);
    ev.error = error;
    finish(id, b, ev, reason);
  }

  // Ends every unfinished branch of a request (cancel, error).
  void finish_all(RequestId id, FinishReason reason, const std::string& error = "") {
    const auto it = requests_.find(id);
    if (it == requests_.end()) return;
    std::vector<Branch*> live;
    for (auto& b : it->second.branches)
      if (!b->finished) live.push_back(b.get());
    for (Branch* b : live) finish_if_live(id, *b, reason, error);  // the last one erases the request
  }

  void finish_cancelled(RequestId id) { finish_all(id, FinishReason::kCancelled); }

  void step_or_fail() {
    try {
      step();
    } catch (const std::exception& e) {
      // A failed forward pass leaves the KV contents unknown: fail every request.
      std::vector<RequestId> ids;
      for (const auto& [id, rs] : requests_) ids.push_back(id);
      for (RequestId id : ids) finish_all(id, FinishReason::kError, e.what());
    }
    finish_failures();
  }

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

  // Ends the requests that failed in this step: each unfinished branch gets
  // finish_reason "error" with the cause, and their KV blocks go back.
  void finish_failures() {
    std::map<RequestId, std::string> failed;
    failed.swap(failures_);
    for (const auto& [id, error] : failed) finish_all(id, FinishReason::kError, error);
  }

  // One step, as the data flows: the scheduler's plan, the drafts it asked
  // for, one forward pass over every chunk, then the outputs (each sampling
  // chunk's tokens sampled or its drafts verified, streamed as events).
  void step() {
    const SchedulerOutput out = schedule();
    if (out.chunks.empty()) return;
    run_draft_model(out);
    const auto start = std::chrono::steady_clock::now();
    forward(out);
    process_outputs(out);
    // The pass with its sampling and verification: what a step of n tokens costs.
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    policy_.step_cost.observe(out.num_tokens(), took.count());
  }

  // Plans the step (decodes with their drafts, chunked prefills) and applies
  // its block copies (copy-on-write) and preemptions.
  SchedulerOutput schedule() {
    SchedulerOutput out = scheduler_.schedule(draft_source_);
    note_peak_blocks();
    for (const BlockCopy& c : out.copies) runner_->copy_block(c.src, c.dst, c.group);
    if (draft_batch_)
      for (SequenceId id : out.preempted) draft_batch_->release(id);  // recomputed later, drafts included
    check(!out.chunks.empty() || scheduler_.idle(), "a busy scheduler plans work");
    return out;
  }

  // One batched forward pass over the step's chunks: logits_ gets a row per
  // sampling chunk, plus one per draft.
  void forward(const SchedulerOutput& out) {
    std::vector<SequenceChunk> chunks;
    int64_t n_rows = 0;
    for (const ScheduledChunk& c : out.chunks) {
      const auto tokens = std::span<const int32_t>(c.seq->tokens).subspan(static_cast<size_t>(c.start), static_cast<size_t>(c.n));
      chunks.push_back({tokens, c.start, kv_.blocks(c.seq->id), c.samples, c.n_draft + 1, kv_.sliding_blocks(c.seq->id)});
      n_rows += c.samples ? c.n_draft + 1 : 0;
    }
    logits_.resize(static_cast<size_t>(n_rows) * static_cast<size_t>(model_.config().vocab_size));
    runner_->forward_batch(chunks, logits_.data());
    scheduler_.finish_step(out);
    count_step(out);
  }

  // Each sampling chunk's rows of logits_ (theirs to change: processed and
  // sampled in place) become tokens and events.
  void process_outputs(const SchedulerOutput& out) {
    const auto vocab = static_cast<size_t>(model_.config().vocab_size);
    size_t row = 0;
    for (const ScheduledChunk& c : out.chunks) {
      if (!c.samples) continue;
      const auto rows = static_cast<size_t>(c.n_draft + 1);
      const auto span = std::span<float>(logits_).subspan(row * vocab, rows * vocab);
      row += rows;
      const RequestId id = owners_.at(c.seq->id).first;
      if (failed(id)) continue;  // another branch of it failed: it ends after the step
      for_request(id, [&] {
        if (c.n_draft > 0) on_draft_logits(*c.seq, c.n_draft, span);
        else on_logits(*c.seq, span);
      });
    }
  }

  static SpeculationPolicy initial_policy(const EngineOptions& options) {
    SpeculationPolicy policy;
    policy.min_draft_gain = options.spec_min_draft_gain;
    return policy;
  }

  // The start-up cost probe over this engine's target, K/V pool and draft model.
  SpeculationCostProbe cost_probe() {
    const auto forward = [this](const SequenceChunk& chunk, float* logits) {
      runner_->forward_batch(std::span<const SequenceChunk>(&chunk, 1), logits);
    };
    return SpeculationCostProbe(forward, kv_, draft_batch_.get(), model_.config().vocab_size,
                                options_.max_batch_tokens, context_limit_);
  }

  // Auto speculation's step cost from the options, or measured now when asked
  // (with the engine thread's OpenMP team size, restored after); returns its points.
  std::vector<std::pair<int64_t, double>> prepare_step_cost() {
    return cost_probe().prepare(policy_, options_.step_cost, options_.measure_step_cost, options_.threads);
  }

  void count_step(const SchedulerOutput& out) {
    counters_.steps++;
    counters_.preemptions += static_cast<int64_t>(out.preempted.size());
    counters_.prefix_query_tokens += out.prefix_query_tokens;
    counters_.prefix_hit_tokens += out.prefix_hit_tokens;
    for (const ScheduledChunk& c : out.chunks) {
      // Prompt tokens computed for the first time (recompute after preemption excluded).
      const int64_t prompt_end = std::min(c.start + c.n, c.seq->prompt_len);
      if (c.start < prompt_end && c.seq->num_generated() == 0) counters_.prompt_tokens_total += prompt_end - c.start;
    }
  }

  // Samples the next token of `seq` from its row of logits and streams it.
  // The first logits of a request with n > 1 fork its sequence into the
  // other branches, and every branch samples its first token from them.
  void on_logits(Sequence& seq, std::span<float> row) {
    const auto [id, index] = owners_.at(seq.id);
    RequestState& rs = requests_.at(id);
    if (rs.forked || rs.request.n == 1) return sample(id, *rs.branches[static_cast<size_t>(index)], seq, row);
    rs.forked = true;
    std::vector<std::pair<Branch*, Sequence*>> all = {{rs.branches[0].get(), &seq}};
    for (size_t i = 1; i < rs.branches.size(); ++i) {
      Branch& b = *rs.branches[i];
      all.emplace_back(&b, scheduler_.fork(seq.id, new_sequence(id, b)));
    }
    // Sampling changes its row: every branch but the last samples from a copy.
    for (size_t i = 0; i + 1 < all.size(); ++i) {
      fork_row_.assign(row.begin(), row.end());
      sample(id, *all[i].first, *all[i].second, fork_row_);
    }
    sample(id, *all.back().first, *all.back().second, row);  // the last branch to finish erases rs
  }

  // The branch's next token from `row`, processed and sampled in place: the
  // adjusted distribution is sampled from and reported in logprobs (taken
  // before the sampler's penalties change the row).
  void sample(RequestId id, Branch& b, Sequence& seq, std::span<float> row) {
    RequestState& rs = requests_.at(id);
    if (b.completion_tokens == 0) rs.cached_tokens = seq.prefix_hit_tokens;
    if (b.logits.changes(b.completion_tokens)) b.logits.process(row, b.completion_tokens);
    std::span<const float> log_probs;
    int32_t token = 0;
    try {
      if (rs.request.top_logprobs >= 0) log_probs = output_.log_probs(row);
      token = b.sampler.sample(row, seq.tokens);
    } catch (const Error& e) {  // e.g. a constraint that no token can continue: this branch alone fails
      return finish_if_live(id, b, FinishReason::kError, e.what());
    }
    seq.tokens.push_back(token);
    GenerationEvent ev = base_event(id, rs, b);
    const FinishReason reason = output_.take_token(seq, rs.request, b, token, seq.num_tokens(), log_probs, ev);
    if (reason != FinishReason::kNone) return finish(id, b, ev, reason);
    rs.on_event(ev);
  }

  // Verifies the drafts of a speculative chunk against its rows
  // [n_draft + 1][vocab] (processed in place, each for its position), rolls
  // the rejected ones back and streams the round's tokens, stopping at the
  // first that ends the request.
  void on_draft_logits(Sequence& seq, int64_t n_draft, std::span<float> rows) {
    const auto [id, index] = owners_.at(seq.id);
    RequestState& rs = requests_.at(id);
    Branch& b = *rs.branches[static_cast<size_t>(index)];
    const auto vocab = static_cast<size_t>(model_.config().vocab_size);
    const int64_t base = seq.num_tokens() - n_draft;  // the history the drafts follow
    const auto history = std::span<const int32_t>(seq.tokens).first(static_cast<size_t>(base));
    if (b.logits.changes(b.completion_tokens))
      b.logits.process_rows(rows, vocab, std::span<const int32_t>(seq.tokens).subspan(static_cast<size_t>(base)),
                            b.completion_tokens);
    const int64_t accepted = b.spec.verify(rows, n_draft, history, b.sampler, verify_scratch_, produced_);
    count_speculation(n_draft, accepted);
    scheduler_.resolve_drafts(seq, accepted);
    seq.tokens.push_back(produced_.back());  // the accepted drafts are already there
    GenerationEvent ev = base_event(id, rs, b);
    for (size_t i = 0; i < produced_.size(); ++i) {
      const auto row = rows.subspan(i * vocab, vocab);
      const auto log_probs = rs.request.top_logprobs >= 0 ? output_.log_probs(row) : std::span<const float>{};
      const int64_t length = base + static_cast<int64_t>(i) + 1;
      const FinishReason reason = output_.take_token(seq, rs.request, b, produced_[i], length, log_probs, ev);
      if (reason != FinishReason::kNone) return finish(id, b, ev, reason);
    }
    rs.on_event(ev);
  }

  // Where the draft stage finds a branch's speculation, sampler, constraint and remaining tokens.
  static DraftingBranch drafting(RequestState& rs, Branch& b) {
    return {&b.spec, &b.sampler, b.matcher.get(), rs.request.max_tokens - b.completion_tokens};
  }

  // The draft model's passes for this step's drafts, before the target's pass that verifies them.
  void run_draft_model(const SchedulerOutput& out) {
    const auto branch_of = [this](const Sequence& seq) {
      const auto [id, index] = owners_.at(seq.id);
      RequestState& rs = requests_.at(id);
      return drafting(rs, *rs.branches[static_cast<size_t>(index)]);
    };
    draft_stage_.run(out.chunks, branch_of);  // its pass count is published with the other metrics
  }

  // Drafts for a decoding request that asked for speculation (Scheduler's
  // DraftSource); none for a request that failed (it ends after the step).
  std::span<const int32_t> drafts_for(const Sequence& seq, int64_t max_drafts, int64_t batch_tokens) {
    const std::pair<RequestId, int32_t> owner = owners_.at(seq.id);
    std::span<const int32_t> drafts;
    if (failed(owner.first)) return drafts;
    for_request(owner.first, [&] {
      RequestState& rs = requests_.at(owner.first);
      drafts = draft_stage_.propose(seq, drafting(rs, *rs.branches[static_cast<size_t>(owner.second)]), max_drafts,
                                    batch_tokens);
    });
    return drafts;
  }

  void count_speculation(int64_t drafts, int64_t accepted) {
    counters_.spec_rounds++;
    counters_.spec_draft_tokens += drafts;
    counters_.spec_accepted_tokens += accepted;
  }

  // Planning a step is when the most blocks are held: freeing waits for its end.
  void note_peak_blocks() {
    EngineMetrics& m = counters_;
    m.kv_blocks_used_peak = std::max(m.kv_blocks_used_peak, kv_.pool().used());
    if (kv_.has_sliding_group())
      m.kv_sliding_blocks_used_peak = std::max(m.kv_sliding_blocks_used_peak, kv_.sliding_pool().used());
    m.kv_bytes_used_peak = m.kv_blocks_used_peak * runner_->block_bytes(KVGroup::kFull) +
                           m.kv_sliding_blocks_used_peak * runner_->block_bytes(KVGroup::kSliding);
  }

  void publish_metrics() {
    const BlockPool& pool = kv_.pool();
    std::lock_guard lock(mutex_);
    metrics_ = counters_;  // the counts; the gauges below are read now
    metrics_.generated_tokens_total = output_.tokens_taken();
    metrics_.running = scheduler_.n_running();
    scheduler_waiting_ = scheduler_.n_waiting();
    metrics_.kv_blocks_total = pool.total();
    metrics_.kv_blocks_used = pool.used();
    metrics_.kv_blocks_free = pool.free();
    metrics_.kv_blocks_cached = pool.cached();
    metrics_.kv_tokens_stored = scheduler_.computed_tokens();
    metrics_.kv_slots_allocated = pool.used() * pool.block_size();
    if (draft_batch_) {
      metrics_.draft_kv_blocks_total = draft_batch_->pool().total();
      metrics_.draft_kv_blocks_used = draft_batch_->pool().used();
      metrics_.spec_draft_passes = draft_stage_.passes();
    }
    if (!kv_.has_sliding_group()) return;
    const BlockPool& sliding = kv_.sliding_pool();
    metrics_.kv_sliding_blocks_total = sliding.total();
    metrics_.kv_sliding_blocks_used = sliding.used();
    metrics_.kv_sliding_blocks_cached = sliding.cached();
  }

  const Model& model_;
  const Tokenizer& tokenizer_;
  EngineOptions options_;
  KVPoolBlocks pools_;
  int64_t context_limit_;  // tokens with K/V per sequence at most
  const RequestLimits limits_{static_cast<int32_t>(model_.config().vocab_size), context_limit_,
                              options_.draft_model != nullptr};
  // Engine-thread state:
  KVCacheManager kv_;
  Scheduler scheduler_;
  std::unique_ptr<ModelRunner> runner_;  // the layers and their K/V bytes, here or along a pipeline
  std::unique_ptr<DraftModelBatch> draft_batch_;  // null without a draft model
  std::map<RequestId, RequestState> requests_;
  std::map<SequenceId, std::pair<RequestId, int32_t>> owners_;  // each branch's sequence -> (request, branch)
  std::map<RequestId, std::string> failures_;  // requests whose own processing threw this step, with the cause
  SequenceId next_seq_ = kNoSequence + 1;
  std::vector<float> logits_;          // [rows][vocab] of the current step: one per sampling chunk + one per draft
  std::vector<float> fork_row_;        // [vocab] a copy of a forking request's first row, for one branch
  std::vector<int32_t> end_of_generation_ids_ = end_of_generation_ids(tokenizer_, model_.config().vocab_size);
  VerifyScratch verify_scratch_;       // speculative verification's [vocab] rows
  std::vector<int32_t> produced_;      // a verified round's tokens
  OutputProcessor output_{tokenizer_};  // logprobs, text, stop conditions of each generated token
  EngineMetrics counters_;  // counted on the engine thread without a lock; publish_metrics() copies it
  // Auto speculation's step cost and draft-model statistics.
  SpeculationPolicy policy_ = initial_policy(options_);
  DraftStage draft_stage_{draft_batch_.get(), policy_};
  DraftSource draft_source_ = [this](const Sequence& seq, int64_t max_drafts, int64_t batch_tokens) {
    return drafts_for(seq, max_drafts, batch_tokens);
  };
  // Shared with other threads, under mutex_:
  mutable std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<Pending> inbox_;
  std::set<RequestId> cancelled_;
  std::set<RequestId> live_;  // submitted and not finished
  RequestId next_id_ = 1;
  bool stopping_ = false;
  bool exit_ = false;
  EngineMetrics metrics_;
  // The scheduler's waiting queue at the last step; the inbox is counted apart
  // (publishing their sum once double-counted the inbox and refused requests).
  int64_t scheduler_waiting_ = 0;
  // Before the thread: measured here it is not on a request's clock. Immutable once the constructor returns.
  const std::vector<std::pair<int64_t, double>> step_cost_at_start_ = prepare_step_cost();
  std::thread thread_;  // last: starts after every other member is ready
};

namespace {
// Throws before the engine thread starts: a draft model with another
// vocabulary, a step cost point with n < 1 or a non-positive time.
const EngineOptions& checked_options(const Model& model, const EngineOptions& options) {
  if (options.draft_model != nullptr) check_same_vocabulary(model, *options.draft_model);
  StepCost{}.set_points(options.step_cost);
  return options;
}
}  // namespace

Engine::Engine(const Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(model, tokenizer, checked_options(model, options))) {
  // The engine thread's team is to be the only busy one (kernels/openmp_wait.h).
  release_this_threads_openmp_pool();
}
Engine::~Engine() = default;
std::optional<RequestId> Engine::submit(GenerationRequest request, EventCallback on_event) {
  return impl_->submit(std::move(request), std::move(on_event));
}
void Engine::cancel(RequestId id) { impl_->cancel(id); }
EngineMetrics Engine::metrics() const { return impl_->metrics(); }
void Engine::shutdown(bool finish_running) { impl_->shutdown(finish_running); }
const EngineOptions& Engine::options() const { return impl_->options(); }
const RequestLimits& Engine::request_limits() const { return impl_->request_limits(); }
const std::vector<std::pair<int64_t, double>>& Engine::step_cost_at_start() const { return impl_->step_cost_at_start(); }

}  // namespace kvserve

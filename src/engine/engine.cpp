// The Engine boundary over continuous batching. The engine thread loops:
// take new requests and cancellations, let the Scheduler plan one step
// (running decodes, with speculative drafts for requests that ask for them, +
// chunked prefills under the token budget), run one batched forward pass over
// the paged KV cache, sample where a chunk reached the end of its known tokens
// (or verify its drafts), stream events, and drop finished sequences.
//
// State: the model and tokenizer are shared and const; KV memory is the
// KVCacheManager (metadata) + PagedKVStorage (bytes); per-request sampling
// and text state live in RequestState; only the inbox, the cancel set, the
// live-id set and the metrics snapshot are shared with other threads, under
// mutex_.
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
#include "engine/request_state.h"
#include "engine/request_validation.h"
#include "engine/batch_speculation.h"
#include "engine/scheduler.h"
#include "kernels/openmp_wait.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_planner.h"
#include "kv/paged_kv_storage.h"
#include "model/transformer.h"

namespace kvserve {
namespace {

struct Pending {
  RequestId id;
  GenerationRequest request;
  EventCallback on_event;
};

TokenLogprob logprob_of(std::span<const float> logits, int32_t id, int32_t top, std::vector<float>& scratch) {
  Sampler::log_softmax(logits, scratch);
  TokenLogprob lp{id, scratch[static_cast<size_t>(id)], {}};
  if (top > 0) {
    std::vector<int32_t> ids(scratch.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const auto k = std::min<size_t>(static_cast<size_t>(top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                      [&](int32_t a, int32_t b) { return scratch[static_cast<size_t>(a)] > scratch[static_cast<size_t>(b)]; });
    for (size_t i = 0; i < k; ++i) lp.top.emplace_back(ids[i], scratch[static_cast<size_t>(ids[i])]);
  }
  return lp;
}

std::vector<int32_t> end_of_generation_ids(const Tokenizer& tokenizer, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < std::min(vocab, tokenizer.vocab_size()); ++id)
    if (tokenizer.is_end_of_generation(id)) ids.push_back(id);
  return ids;
}

// Whether the sliding-window layers' K/V go to their own group, which frees
// the blocks that left every window (docs/kv_planner.md).
bool uses_sliding_group(const ModelConfig& c, const EngineOptions& o) {
  // A pipeline's stages mirror one pool shape: its ranks keep every position (docs/scaling.md).
  return o.sliding_window_kv && o.pipeline.comm == nullptr && c.sliding_window > 0 &&
         std::find(c.layer_is_sliding.begin(), c.layer_is_sliding.end(), true) != c.layer_is_sliding.end();
}

// Blocks in each group's pool (sliding 0: no sliding group).
struct PoolBlocks {
  int64_t full = 0;
  int64_t sliding = 0;
};

// Blocks in the pool: an explicit count, a byte budget, or room for
// max_running full contexts capped at 1 GiB. A draft model's pool has as many
// blocks as the full pool: its bytes count with them. With a sliding group, that
// group's pool holds max_running sequences' windows (no more than the full
// pool) and the full pool gets the rest of the budget.
PoolBlocks pool_blocks(const ModelConfig& c, const EngineOptions& o, int64_t context) {
  if (o.block_size <= 0) throw Error("block_size must be positive, got " + std::to_string(o.block_size));
  const int64_t B = o.block_size, context_blocks = (context + B - 1) / B;
  const int64_t full_contexts = o.max_running * context_blocks;
  const auto n_sliding = static_cast<int64_t>(
      uses_sliding_group(c, o) ? std::count(c.layer_is_sliding.begin(), c.layer_is_sliding.end(), true) : 0);
  // The sliding pool's size: max_running sequences' windows.
  int64_t sliding_cap = 0;
  if (n_sliding > 0) {
    const int64_t chunk = std::max<int64_t>(o.max_batch_tokens, 1);
    const int64_t per_sequence = std::min(sliding_blocks_per_sequence(c.sliding_window, chunk, B), context_blocks);
    sliding_cap = std::max<int64_t>(o.max_running, 1) * per_sequence;
  }
  if (o.kv_blocks > 0) return {o.kv_blocks, std::min(o.kv_blocks, sliding_cap)};
  int64_t full_bytes = PagedKVStorage::bytes_per_block(c.n_layers - n_sliding, B, c.n_kv_heads, c.head_dim, o.kv_type);
  if (o.draft_model != nullptr) full_bytes += DraftModelBatch::bytes_per_block(o.draft_model->config(), B);
  const int64_t sliding_bytes = PagedKVStorage::bytes_per_block(n_sliding, B, c.n_kv_heads, c.head_dim, o.kv_type);
  const int64_t per_block = full_bytes + sliding_bytes;
  if (o.kv_memory_bytes > 0 && o.kv_memory_bytes < per_block)
    throw Error("kv_memory_bytes " + std::to_string(o.kv_memory_bytes) + " is smaller than one KV block (" +
                std::to_string(per_block) + " bytes)");
  const int64_t budget = o.kv_memory_bytes > 0 ? o.kv_memory_bytes : int64_t{1} << 30;
  // Full blocks T with T * full_bytes + min(T, sliding_cap) * sliding_bytes <= budget.
  int64_t full = budget / per_block;
  if (full > sliding_cap && n_sliding > 0)
    full = full_bytes > 0 ? (budget - sliding_cap * sliding_bytes) / full_bytes : full_contexts;
  if (o.kv_memory_bytes <= 0) full = std::max<int64_t>(1, std::min(full_contexts, full));
  return {full, std::min(full, sliding_cap)};
}

KVCacheManager make_kv_manager(const ModelConfig& c, const EngineOptions& o, const PoolBlocks& pools) {
  if (pools.sliding == 0) return KVCacheManager(pools.full, o.block_size, o.prefix_caching);
  return KVCacheManager(pools.full, o.block_size, o.prefix_caching, SlidingKVGroup{c.sliding_window, pools.sliding});
}

PagedKVStorage make_kv_storage(const ModelConfig& c, const EngineOptions& o, const PoolBlocks& pools) {
  if (pools.sliding == 0) return PagedKVStorage(c.n_layers, pools.full, o.block_size, c.n_kv_heads, c.head_dim, o.kv_type);
  return PagedKVStorage(c.layer_is_sliding, pools.full, pools.sliding, o.block_size, c.n_kv_heads, c.head_dim, o.kv_type);
}

// Every layer here, or the first stage of a pipeline (the model is then rank 0's slice).
std::unique_ptr<ModelRunner> make_runner(const Model& model, const EngineOptions& o, const PoolBlocks& pools) {
  if (o.pipeline.comm == nullptr) return make_local_runner(model, make_kv_storage(model.config(), o, pools));
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
        kv_(make_kv_manager(model.config(), options, pools_)),
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
      if (requests_.count(id) > 0) return finish_all(id, "error", e.what());
      refuse(id, n, p.on_event, e.what());
    }
  }

  // Makes the request's state (the callback moves in last: refuse() needs it
  // if the state cannot be made) and queues its first sequence.
  void start(Pending& p) {
    const RequestId id = p.id;
    const SpeculationContext speculation{draft_batch_.get(), &policy_};
    if (p.request.speculation.mode == SpeculativeMode::kAuto && !policy_.step_cost.measured()) measure_speculation_costs();
    auto [it, inserted] = requests_.try_emplace(id, std::move(p.request), EventCallback{}, tokenizer_, speculation);
    check(inserted, "request ids are unique");
    RequestState& rs = it->second;
    rs.on_event = std::move(p.on_event);
    if (rs.request.max_tokens == 0) return finish_all(id, "length");
    auto seq = std::make_unique<Sequence>();
    seq->id = new_sequence(id, *rs.branches[0]);
    seq->tokens = rs.request.prompt;
    seq->prompt_len = static_cast<int64_t>(rs.request.prompt.size());
    seq->max_kv_tokens = context_limit_;
    scheduler_.add(std::move(seq));
  }

  // Ends a request whose state could not be made: every branch's final event carries the error.
  void refuse(RequestId id, int32_t n, const EventCallback& on_event, const std::string& error) {
    {
      std::lock_guard lock(mutex_);
      metrics_.requests_finished++;
    }
    for (int32_t i = 0; i < n && on_event; ++i) {
      GenerationEvent ev;
      ev.id = id;
      ev.index = i;
      ev.finished = true;
      ev.finish_reason = "error";
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
  void finish(RequestId id, Branch& b, GenerationEvent& ev, const std::string& reason) {
    scheduler_.remove(b.seq);
    owners_.erase(b.seq);
    if (draft_batch_) draft_batch_->release(b.seq);  // its draft K/V, at once (other branches may run on)
    b.finished = true;
    ev.finished = true;
    ev.finish_reason = reason;
    const auto it = requests_.find(id);
    if (--it->second.unfinished > 0) return for_request(id, [&] { it->second.on_event(ev); });
    EventCallback callback = std::move(it->second.on_event);
    requests_.erase(it);
    // Counters first: a client that reads the metrics after its final event
    // must see its request finished and its blocks back in the pool.
    {
      std::lock_guard lock(mutex_);
      metrics_.requests_finished++;
    }
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
  void finish_if_live(RequestId id, Branch& b, const std::string& reason, const std::string& error = "") {
    if (b.finished) return;
    GenerationEvent ev = base_event(id, requests_.at(id), b);
    ev.error = error;
    finish(id, b, ev, reason);
  }

  // Ends every unfinished branch of a request (cancel, error).
  void finish_all(RequestId id, const std::string& reason, const std::string& error = "") {
    const auto it = requests_.find(id);
    if (it == requests_.end()) return;
    std::vector<Branch*> live;
    for (auto& b : it->second.branches)
      if (!b->finished) live.push_back(b.get());
    for (Branch* b : live) finish_if_live(id, *b, reason, error);  // the last one erases the request
  }

  void finish_cancelled(RequestId id) { finish_all(id, "cancelled"); }

  void step_or_fail() {
    try {
      step();
    } catch (const std::exception& e) {
      // A failed forward pass leaves the KV contents unknown: fail every request.
      std::vector<RequestId> ids;
      for (const auto& [id, rs] : requests_) ids.push_back(id);
      for (RequestId id : ids) finish_all(id, "error", e.what());
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
    for (const auto& [id, error] : failed) finish_all(id, "error", error);
  }

  void step() {
    const SchedulerOutput out = scheduler_.schedule(draft_source_);
    note_peak_blocks();
    for (const BlockCopy& c : out.copies) runner_->copy_block(c.src, c.dst, c.group);
    if (draft_batch_)
      for (SequenceId id : out.preempted) draft_batch_->release(id);  // recomputed later, drafts included
    check(!out.chunks.empty() || scheduler_.idle(), "a busy scheduler plans work");
    if (out.chunks.empty()) return;
    run_draft_model(out);
    std::vector<SequenceChunk> chunks;
    int64_t n_rows = 0;  // logits rows: one per sampling chunk, plus one per draft
    for (const ScheduledChunk& c : out.chunks) {
      const auto tokens = std::span<const int32_t>(c.seq->tokens).subspan(static_cast<size_t>(c.start), static_cast<size_t>(c.n));
      chunks.push_back({tokens, c.start, kv_.blocks(c.seq->id), c.samples, c.n_draft + 1, kv_.sliding_blocks(c.seq->id)});
      n_rows += c.samples ? c.n_draft + 1 : 0;
    }
    const auto vocab = static_cast<size_t>(model_.config().vocab_size);
    logits_.resize(static_cast<size_t>(n_rows) * vocab);
    const auto start = std::chrono::steady_clock::now();
    runner_->forward_batch(chunks, logits_.data());
    scheduler_.finish_step(out);
    count_step(out);
    size_t row = 0;
    for (const ScheduledChunk& c : out.chunks) {
      if (!c.samples) continue;
      const auto rows = static_cast<size_t>(c.n_draft + 1);
      const auto span = std::span<const float>(logits_).subspan(row * vocab, rows * vocab);
      row += rows;
      const RequestId id = owners_.at(c.seq->id).first;
      if (failed(id)) continue;  // another branch of it failed: it ends after the step
      for_request(id, [&] {
        if (c.n_draft > 0) on_draft_logits(*c.seq, c.n_draft, span);
        else on_logits(*c.seq, span);
      });
    }
    // The pass with its sampling and verification: what a step of n tokens costs.
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    policy_.step_cost.observe(out.num_tokens(), took.count());
  }

  static SpeculationPolicy initial_policy(const EngineOptions& options) {
    SpeculationPolicy policy;
    policy.min_draft_gain = options.spec_min_draft_gain;
    return policy;
  }

  // Auto speculation's step cost from the options, or measured now when asked
  // (with the engine thread's OpenMP team size, restored after); returns its points.
  std::vector<std::pair<int64_t, double>> prepare_step_cost() {
    policy_.step_cost.set_points(options_.step_cost, /*learn_shape=*/false);
    if (options_.measure_step_cost && !policy_.step_cost.measured()) {
      const int caller_threads = omp_get_max_threads();
      if (options_.threads > 0) omp_set_num_threads(options_.threads);
      measure_speculation_costs();
      omp_set_num_threads(caller_threads);
    }
    return policy_.step_cost.points();
  }

  // Everything auto speculation weighs: t(n), and the draft model's costs when there is one.
  void measure_speculation_costs() {
    measure_step_cost();
    measure_draft_cost();
  }

  // Auto speculation's draft-model costs before any request drafts: d, one
  // draft pass, and the catch-up per history token, on a scratch sequence
  // (32 tokens fed, then one at a time, best of two). Unmeasured, both were 0:
  // every sequence's first choice took the draft model for free and paid its
  // prompt's catch-up blind (auto + draft 0.95x at four sequences).
  void measure_draft_cost() {
    if (!draft_batch_) return;
    const SequenceId scratch = std::numeric_limits<SequenceId>::max() - 1;
    const auto vocab = static_cast<size_t>(options_.draft_model->config().vocab_size);
    std::vector<int32_t> history(33);
    for (size_t i = 0; i < history.size(); ++i) history[i] = static_cast<int32_t>((i * 7919 + 29) % vocab);
    SamplingParams greedy;
    greedy.temperature = 0;
    Sampler sampler(greedy);
    DraftProposal proposal;
    const auto timed_run = [&](std::span<const int32_t> h) {
      if (!draft_batch_->reserve(scratch, h, 1)) return 0.0;
      const DraftModelRequest request{scratch, h, 1, &sampler, &proposal};
      const auto start = std::chrono::steady_clock::now();
      draft_batch_->run(std::span<const DraftModelRequest>(&request, 1));
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    const std::span<const int32_t> all(history);
    const double catch_up = timed_run(all.first(32));
    const double pass = std::min(timed_run(all), timed_run(all));
    draft_batch_->release(scratch);
    if (!(pass > 0)) return;
    policy_.observe_draft_seconds(pass);
    if (catch_up > pass) policy_.observe_catch_up_seconds((catch_up - pass) / 32);
  }

  // Auto speculation's t(n): forward passes over n = 1 .. 17 new tokens after
  // a 32-token context, on a scratch sequence outside the scheduler (its
  // blocks are never published and go back to the pool), best of three each.
  // Every token's logits are computed, as in the steps t(n) stands for (a
  // decode token or a draft each needs its output-head row: a quarter of a
  // token's matmuls on Qwen2.5-Coder-0.5B; with only the last row, drafts
  // looked cheaper than they are and auto lost 4-6% at 4-8 sequences).
  // A pool too small for it leaves t(n) proportional to n (drafting never
  // pays then), which is also what a compute-bound CPU measures.
  void measure_step_cost() {
    const SequenceId scratch = std::numeric_limits<SequenceId>::max();
    const int64_t context = 32;
    std::vector<int64_t> sizes;
    for (int64_t n : {1, 2, 3, 5, 9, 17})
      if (n <= options_.max_batch_tokens && context + n <= context_limit_) sizes.push_back(n);
    std::vector<BlockCopy> copies;
    if (sizes.empty() || !kv_.allocate(scratch, 0, context + sizes.back(), copies)) {
      policy_.step_cost.set_points({{1, 1.0}});
      return;
    }
    const int32_t vocab = model_.config().vocab_size;
    std::vector<int32_t> tokens(static_cast<size_t>(context + sizes.back()));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(vocab));
    logits_.resize(static_cast<size_t>(vocab) * static_cast<size_t>(sizes.back()));
    const auto pass = [&](int64_t pos0, int64_t n) {
      const auto span = std::span<const int32_t>(tokens).subspan(static_cast<size_t>(pos0), static_cast<size_t>(n));
      const int64_t rows = pos0 == 0 ? 1 : n;  // the context pass only fills the cache
      const SequenceChunk chunk{span, pos0, kv_.blocks(scratch), true, rows, kv_.sliding_blocks(scratch)};
      const auto start = std::chrono::steady_clock::now();
      runner_->forward_batch(std::span<const SequenceChunk>(&chunk, 1), logits_.data());
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    pass(0, context);  // also faults the weights in
    // Best of three rounds over every n, the rounds in turn: a slow moment on a shared host then costs one
    // sample of each n rather than bending t(n)'s shape (best of two per n in a row measured t(1) 29 ms where
    // decoding ran at 23, and auto drafted less on the Qwen pair's code: 1.05x instead of 1.36x).
    std::vector<std::pair<int64_t, double>> points;
    for (int64_t n : sizes) points.emplace_back(n, std::numeric_limits<double>::infinity());
    for (int round = 0; round < 3; ++round)
      for (auto& [n, seconds] : points) seconds = std::min(seconds, pass(context, n));
    kv_.free(scratch);
    policy_.step_cost.set_points(points);
  }

  void count_step(const SchedulerOutput& out) {
    std::lock_guard lock(mutex_);
    metrics_.steps++;
    metrics_.preemptions += static_cast<int64_t>(out.preempted.size());
    metrics_.prefix_query_tokens += out.prefix_query_tokens;
    metrics_.prefix_hit_tokens += out.prefix_hit_tokens;
    for (const ScheduledChunk& c : out.chunks) {
      // Prompt tokens computed for the first time (recompute after preemption excluded).
      const int64_t prompt_end = std::min(c.start + c.n, c.seq->prompt_len);
      if (c.start < prompt_end && c.seq->num_generated() == 0) metrics_.prompt_tokens_total += prompt_end - c.start;
    }
  }

  // Samples the next token of `seq` from its logits and streams it. The
  // first logits of a request with n > 1 fork its sequence into the other
  // branches, and every branch samples its first token from them.
  void on_logits(Sequence& seq, std::span<const float> logits) {
    const auto [id, index] = owners_.at(seq.id);
    RequestState& rs = requests_.at(id);
    if (rs.forked || rs.request.n == 1) return sample(id, *rs.branches[static_cast<size_t>(index)], seq, logits);
    rs.forked = true;
    std::vector<std::pair<Branch*, Sequence*>> all = {{rs.branches[0].get(), &seq}};
    for (size_t i = 1; i < rs.branches.size(); ++i) {
      Branch& b = *rs.branches[i];
      all.emplace_back(&b, scheduler_.fork(seq.id, new_sequence(id, b)));
    }
    for (auto [b, s] : all) sample(id, *b, *s, logits);  // the last branch to finish erases rs
  }

  void sample(RequestId id, Branch& b, Sequence& seq, std::span<const float> logits) {
    RequestState& rs = requests_.at(id);
    if (b.completion_tokens == 0) rs.cached_tokens = seq.prefix_hit_tokens;
    if (adjusts_logits(rs.request, b)) {  // the adjusted distribution: sampled from and reported in logprobs
      masked_.assign(logits.begin(), logits.end());
      adjust_logits(rs.request, b, 0, masked_);
      logits = masked_;
    }
    scratch_logits_.assign(logits.begin(), logits.end());
    int32_t token = 0;
    try {
      token = b.sampler.sample(scratch_logits_, seq.tokens);
    } catch (const Error& e) {  // e.g. a constraint that no token can continue: this branch alone fails
      return finish_if_live(id, b, "error", e.what());
    }
    seq.tokens.push_back(token);
    GenerationEvent ev = base_event(id, requests_.at(id), b);
    if (const char* reason = take_token(seq, requests_.at(id).request, b, token, seq.num_tokens(), logits, ev))
      return finish(id, b, ev, reason);
    requests_.at(id).on_event(ev);
  }

  // Verifies the drafts of a speculative chunk against its rows
  // [n_draft + 1][vocab], rolls the rejected ones back and streams the round's
  // tokens, stopping at the first that ends the request.
  void on_draft_logits(Sequence& seq, int64_t n_draft, std::span<const float> rows) {
    const auto [id, index] = owners_.at(seq.id);
    RequestState& rs = requests_.at(id);
    Branch& b = *rs.branches[static_cast<size_t>(index)];
    const int64_t base = seq.num_tokens() - n_draft;  // the history the drafts follow
    const auto history = std::span<const int32_t>(seq.tokens).first(static_cast<size_t>(base));
    if (adjusts_logits(rs.request, b))
      rows = adjusted_rows(rs.request, b, rows, std::span<const int32_t>(seq.tokens).subspan(static_cast<size_t>(base)));
    const int64_t accepted = b.spec.verify(rows, n_draft, history, b.sampler, verify_scratch_, produced_);
    count_speculation(n_draft, accepted);
    scheduler_.resolve_drafts(seq, accepted);
    seq.tokens.push_back(produced_.back());  // the accepted drafts are already there
    GenerationEvent ev = base_event(id, rs, b);
    const auto vocab = static_cast<size_t>(model_.config().vocab_size);
    for (size_t i = 0; i < produced_.size(); ++i) {
      const auto row = rows.subspan(i * vocab, vocab);
      if (const char* reason = take_token(seq, rs.request, b, produced_[i], base + static_cast<int64_t>(i) + 1, row, ev))
        return finish(id, b, ev, reason);
    }
    rs.on_event(ev);
  }

  // Whether the branch's next logits need adjusting before sampling: a
  // bias, min_tokens or a constraint.
  bool adjusts_logits(const GenerationRequest& r, const Branch& b) const {
    return b.matcher || !r.logit_bias.empty() || b.completion_tokens < r.min_tokens;
  }

  // One row of logits for the branch's next token after `ahead` more
  // (drafts): logit_bias added, end tokens masked before min_tokens, then the
  // constraint's mask in the matcher's current state.
  void adjust_logits(const GenerationRequest& r, Branch& b, int64_t ahead, std::span<float> row) const {
    for (const auto& [token, bias] : r.logit_bias) row[static_cast<size_t>(token)] += bias;
    if (b.completion_tokens + ahead < r.min_tokens) {
      constexpr float kMasked = -std::numeric_limits<float>::infinity();
      for (int32_t token : end_of_generation_ids_) row[static_cast<size_t>(token)] = kMasked;
      for (int32_t token : r.stop_token_ids) row[static_cast<size_t>(token)] = kMasked;
    }
    if (b.matcher) b.matcher->mask(row);
  }

  // The verification rows of a speculative round, each adjusted for its
  // position (the grammar state its drafts lead to). Rows after a draft the
  // grammar rejects stay unmasked: that draft has probability 0, so they are
  // never used.
  std::span<const float> adjusted_rows(const GenerationRequest& r, Branch& b, std::span<const float> rows,
                                       std::span<const int32_t> drafts) {
    const auto vocab = static_cast<size_t>(model_.config().vocab_size);
    masked_.assign(rows.begin(), rows.end());
    int32_t accepted = 0;
    for (size_t i = 0; i <= drafts.size(); ++i) {
      adjust_logits(r, b, static_cast<int64_t>(i), std::span<float>(masked_).subspan(i * vocab, vocab));
      if (i == drafts.size() || (b.matcher && !b.matcher->accept(drafts[i]))) break;
      accepted++;
      // A draft that completes the output ends the branch if it is accepted, so no row after it is used; a
      // matcher past its end-of-generation token must not be asked for a mask (xgrammar throws).
      if (b.matcher && b.matcher->finished()) break;
    }
    if (b.matcher) b.matcher->rollback(accepted);
    return masked_;
  }

  // Adds a generated token (sampled from `logits`; the sequence then holds
  // `length` tokens) to the event; returns the finish reason it causes, if any.
  const char* take_token(const Sequence& seq, const GenerationRequest& r, Branch& b, int32_t token, int64_t length,
                         std::span<const float> logits, GenerationEvent& ev) {
    b.completion_tokens++;
    ev.completion_tokens = b.completion_tokens;
    ev.tokens.push_back(token);
    if (r.top_logprobs >= 0) ev.logprobs.push_back(logprob_of(logits, token, r.top_logprobs, scratch_));
    if (b.matcher && !b.matcher->accept(token)) {  // the mask allowed it: only a bug gets here
      ev.error = "the output constraint rejected token " + std::to_string(token);
      return "error";
    }
    const bool eog = !r.ignore_eos && tokenizer_.is_end_of_generation(token);
    ev.text += eog ? b.stops.flush() : b.stops.push(b.stream.push(token));
    {
      std::lock_guard lock(mutex_);
      metrics_.generated_tokens_total++;
    }
    if (eog || b.stops.stopped()) return "stop";
    // A stop token (its text kept), or a complete constraint (only an end-of-generation token could follow).
    const bool stop_token = std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) != r.stop_token_ids.end();
    if (stop_token || (b.matcher && b.matcher->finished())) {
      ev.text += b.stops.push(b.stream.flush()) + b.stops.flush();
      return "stop";
    }
    // The last sampled token needs no K/V slot: a sequence may hold context + 1 tokens.
    if (b.completion_tokens >= r.max_tokens || length > seq.max_kv_tokens) {
      ev.text += b.stops.push(b.stream.flush()) + b.stops.flush();
      return "length";
    }
    return nullptr;
  }

  Branch& branch_of(const Sequence& seq) {
    const auto [id, index] = owners_.at(seq.id);
    return *requests_.at(id).branches[static_cast<size_t>(index)];
  }

  // The draft model's passes for every chunk whose drafts it proposed,
  // batched, before the target's pass that verifies them: the placeholders
  // in the sequences' tokens become the drafts.
  void run_draft_model(const SchedulerOutput& out) {
    draft_requests_.clear();
    drafting_.clear();
    for (const ScheduledChunk& c : out.chunks) {
      if (c.n_draft == 0) continue;
      Branch& b = branch_of(*c.seq);
      if (!b.spec.drafts_pending()) continue;
      const auto history = std::span<const int32_t>(c.seq->tokens).first(static_cast<size_t>(c.seq->num_tokens() - c.n_draft));
      draft_requests_.push_back({c.seq->id, history, c.n_draft, &b.sampler, &b.spec.pending_proposal()});
      drafting_.emplace_back(c.seq, &b);
    }
    if (draft_requests_.empty()) return;
    const auto start = std::chrono::steady_clock::now();
    draft_batch_->run(draft_requests_);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    int64_t passes = 0;  // draft positions: one batched draft pass each, whatever the sequences
    for (auto [seq, b] : drafting_) {
      const std::vector<int32_t>& drafts = b->spec.pending_proposal().tokens;
      std::copy(drafts.begin(), drafts.end(), seq->tokens.end() - static_cast<std::ptrdiff_t>(drafts.size()));
      b->spec.drafts_computed();
      passes = std::max(passes, static_cast<int64_t>(drafts.size()));
    }
    // Auto's d, the draft's seconds per draft position (a pass over every
    // drafting sequence; charged in full to each sequence that considers
    // drafting, as if it drafted alone: per drafted token, d looked 4x
    // cheaper when four sequences had drafted together than a lone drafter
    // then paid, and auto + draft lost 4% on code at four sequences). Only
    // from rounds without a long catch-up: a first round also prefills the
    // prompt into the draft, and counting that once made d so large that the
    // draft model was never chosen again (and d never corrected). Runs that
    // caught up on more history give the catch-up's cost per token (what is
    // left once the drafts' own passes, at d each, are taken out).
    const int64_t catch_up = draft_batch_->last_catch_up_tokens();
    if (catch_up <= 2 * static_cast<int64_t>(drafting_.size()))
      policy_.observe_draft_seconds(took.count() / static_cast<double>(passes));
    else if (policy_.draft_seconds_per_pass > 0)
      policy_.observe_catch_up_seconds(
          std::max(0.0, took.count() - static_cast<double>(passes) * policy_.draft_seconds_per_pass) /
          static_cast<double>(catch_up));
    std::lock_guard lock(mutex_);
    metrics_.spec_draft_passes = draft_batch_->passes();
  }

  // Drafts for a decoding request that asked for speculation (Scheduler's
  // DraftSource); none for a request that failed (it ends after the step).
  std::span<const int32_t> drafts_for(const Sequence& seq, int64_t max_drafts, int64_t batch_tokens) {
    const RequestId id = owners_.at(seq.id).first;
    std::span<const int32_t> drafts;
    if (!failed(id)) for_request(id, [&] { drafts = propose_drafts(seq, max_drafts, batch_tokens); });
    return drafts;
  }

  std::span<const int32_t> propose_drafts(const Sequence& seq, int64_t max_drafts, int64_t batch_tokens) {
    const auto [id, index] = owners_.at(seq.id);
    RequestState& rs = requests_.at(id);
    Branch& b = *rs.branches[static_cast<size_t>(index)];
    // A round yields up to drafts + 1 tokens: stay within max_tokens and the sequence's K/V slots.
    const int64_t remaining = rs.request.max_tokens - b.completion_tokens;
    const int64_t limit = std::min({max_drafts, remaining - 1, seq.max_kv_tokens - seq.num_tokens()});
    const std::span<const int32_t> drafts = b.spec.propose(seq.id, seq.tokens, limit, batch_tokens, remaining, b.sampler);
    if (!b.matcher || drafts.empty() || !b.spec.proposal_deterministic()) return drafts;
    // Cut a deterministic proposal at the first draft the grammar rejects:
    // it would be rejected anyway (probability 0), so the cut only saves work.
    // Drafts after one that completes the output are never used either (that token ends the branch).
    int32_t valid = 0;
    while (valid < static_cast<int32_t>(drafts.size()) && b.matcher->accept(drafts[static_cast<size_t>(valid)])) {
      valid++;
      if (b.matcher->finished()) break;
    }
    b.matcher->rollback(valid);
    b.spec.keep_first(valid);
    return drafts.first(static_cast<size_t>(valid));
  }

  void count_speculation(int64_t drafts, int64_t accepted) {
    std::lock_guard lock(mutex_);
    metrics_.spec_rounds++;
    metrics_.spec_draft_tokens += drafts;
    metrics_.spec_accepted_tokens += accepted;
  }

  // Planning a step is when the most blocks are held: freeing waits for its end.
  void note_peak_blocks() {
    std::lock_guard lock(mutex_);
    EngineMetrics& m = metrics_;
    m.kv_blocks_used_peak = std::max(m.kv_blocks_used_peak, kv_.pool().used());
    if (kv_.has_sliding_group())
      m.kv_sliding_blocks_used_peak = std::max(m.kv_sliding_blocks_used_peak, kv_.sliding_pool().used());
    m.kv_bytes_used_peak = m.kv_blocks_used_peak * runner_->block_bytes(KVGroup::kFull) +
                           m.kv_sliding_blocks_used_peak * runner_->block_bytes(KVGroup::kSliding);
  }

  void publish_metrics() {
    const BlockPool& pool = kv_.pool();
    std::lock_guard lock(mutex_);
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
  PoolBlocks pools_;
  int64_t context_limit_;  // tokens with K/V per sequence at most
  const RequestLimits limits_{static_cast<int32_t>(model_.config().vocab_size), context_limit_,
                              options_.draft_model != nullptr};
  // Engine-thread state:
  KVCacheManager kv_;
  Scheduler scheduler_;
  std::unique_ptr<ModelRunner> runner_;  // the layers and their K/V bytes, here or along a pipeline
  std::unique_ptr<DraftModelBatch> draft_batch_;  // null without a draft model
  std::vector<DraftModelRequest> draft_requests_;  // the current step's
  std::vector<std::pair<Sequence*, Branch*>> drafting_;  // their sequences and branches, in the same order
  std::map<RequestId, RequestState> requests_;
  std::map<SequenceId, std::pair<RequestId, int32_t>> owners_;  // each branch's sequence -> (request, branch)
  std::map<RequestId, std::string> failures_;  // requests whose own processing threw this step, with the cause
  SequenceId next_seq_ = kNoSequence + 1;
  std::vector<float> logits_;          // [rows][vocab] of the current step: one per sampling chunk + one per draft
  std::vector<float> scratch_logits_;  // [vocab] the sampler's working copy
  std::vector<float> scratch_;         // [vocab] log-softmax for logprobs
  std::vector<float> masked_;          // [rows][vocab] a branch's adjusted logits (bias, min_tokens, constraint)
  std::vector<int32_t> end_of_generation_ids_ = end_of_generation_ids(tokenizer_, model_.config().vocab_size);
  VerifyScratch verify_scratch_;       // speculative verification's [vocab] rows
  std::vector<int32_t> produced_;      // a verified round's tokens
  // Auto speculation's step cost and draft-model statistics.
  SpeculationPolicy policy_ = initial_policy(options_);
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

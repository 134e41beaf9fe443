// The Engine boundary over continuous batching. The engine thread loops:
// take new requests (the RequestTable builds each sequence's state: sampler,
// logits processors, stop strings, drafter) and cancellations, run one step,
// publish the metrics. A step is, as the data flows:
//   schedule()         the Scheduler plans running decodes (with speculative
//                      drafts for requests that ask for them) + chunked
//                      prefills under the token budget;
//   run_draft_model()  the draft model's batched passes for those drafts;
//   forward()          one batched forward pass over the paged KV cache;
//   sampling_.run()    where a chunk reached the end of its known tokens, its
//                      logits rows are processed in place, sampled or its
//                      drafts verified, and each token goes through the
//                      OutputProcessor into an event (engine/sampling_stage.h);
//                      finished sequences free their blocks at once.
//
// State: the model and tokenizer are shared and const; KV memory is the
// KVCacheManager (metadata) + PagedKVStorage (bytes); each request's
// per-sequence sampling and text state, and which request each scheduled
// sequence belongs to, live in the RequestTable (engine/request_table.h);
// only the inbox, the cancel set, the live-id set and the metrics snapshot
// are shared with other threads, under mutex_. Counters are kept on the engine thread and published once per
// loop iteration (and before a request's final event).
#include "engine/engine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"
#include "engine/finish_reason.h"
#include "engine/request_table.h"
#include "engine/request_validation.h"
#include "engine/sampling_stage.h"
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

// What the engine asks of its pools for this model and these options (kv/kv_pool_sizing.h).
KVPoolRequest pool_request(const ModelConfig& c, const EngineOptions& o, const ModelConfig* draft) {
  KVPoolRequest r;
  r.block_size = o.block_size;
  r.type = o.kv_type;
  r.context = std::min(o.max_context, c.context_length);
  r.sequences = o.max_running;
  r.chunk = o.max_batch_tokens;
  r.blocks = o.kv_blocks;
  r.memory_bytes = o.kv_memory_bytes;
  if (draft != nullptr && o.block_size > 0) r.extra_bytes_per_block = DraftModelBatch::bytes_per_block(*draft, o.block_size);
  // A pipeline's stages mirror one pool shape: its ranks keep every position (docs/scaling.md).
  r.sliding_group = o.sliding_window_kv && o.pipeline.comm == nullptr;
  return r;
}

const ModelConfig* draft_config(const EngineOptions& o) {
  return o.draft_model == nullptr ? nullptr : &o.draft_model->config();
}

KVPoolBlocks pool_blocks(const ModelConfig& c, const EngineOptions& o) {
  return kv_pool_blocks(c.kv_shape(), pool_request(c, o, draft_config(o)));
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
        pools_(pool_blocks(model.config(), options)),
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

  std::optional<RequestId> submit(ValidatedRequest validated, EventCallback on_event) {
    if (!(validated.limits() == limits_)) validate_request(validated.request(), limits_);
    GenerationRequest request = std::move(validated).take();
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
      for (RequestId id : cancels) requests_.finish_all(id, FinishReason::kCancelled);
      if (!scheduler_.idle()) step_or_fail();
      publish_metrics();
    }
  }

  // Takes a request in. What throws here (the cost probe, a matcher or
  // drafter that cannot be made) fails that request alone.
  void admit(Pending p) {
    try {
      if (p.request.speculation.mode == SpeculativeMode::kAuto && !policy_.step_cost.measured())
        cost_probe().measure(policy_);
    } catch (const std::exception& e) {
      return requests_.refuse(p.id, p.request.n, p.on_event, e.what());
    }
    requests_.start(p.id, std::move(p.request), std::move(p.on_event), {draft_batch_.get(), &policy_}, context_limit_);
  }

  // Counted and published before a request's final event (RequestTable::Hooks).
  void count_finished_request() {
    counters_.requests_finished++;
    publish_metrics();
  }

  // A request has sent its last event: shutdown() may return once none is left.
  void forget(RequestId id) {
    std::lock_guard lock(mutex_);
    live_.erase(id);
    if (live_.empty()) idle_.notify_all();
  }

  void step_or_fail() {
    try {
      step();
    } catch (const std::exception& e) {
      requests_.finish_every(FinishReason::kError, e.what());  // the KV contents are unknown now
    }
    requests_.finish_failures();
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
    sampling_.run(out, logits_, first_row_);
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

  // Where the draft stage finds a sequence's speculation, sampler, constraint and remaining tokens.
  DraftingSequence drafting(const Sequence& seq) {
    const auto [id, rs, state] = requests_.owner(seq);
    return {&state.spec, &state.sampler, state.matcher.get(), rs.request.max_tokens - state.completion_tokens};
  }

  // The draft model's passes for this step's drafts, before the target's pass that verifies them.
  void run_draft_model(const SchedulerOutput& out) {
    // Its pass count is published with the other metrics.
    draft_stage_.run(out.chunks, [this](const Sequence& seq) { return drafting(seq); });
  }

  // Drafts for a decoding request that asked for speculation (Scheduler's
  // DraftSource); none for a request that failed (it ends after the step).
  std::span<const int32_t> drafts_for(const Sequence& seq, int64_t max_drafts, int64_t batch_tokens) {
    const RequestId id = requests_.owner(seq).id;
    std::span<const int32_t> drafts;
    if (requests_.failed(id)) return drafts;
    requests_.for_request(id, [&] { drafts = draft_stage_.propose(seq, drafting(seq), max_drafts, batch_tokens); });
    return drafts;
  }

  // One batched forward pass over the step's chunks: logits_ gets each
  // chunk's logit_rows() (a row per sampling chunk, plus one per draft, or
  // every row of a prompt being scored), chunk i's from row first_row_[i].
  void forward(const SchedulerOutput& out) {
    std::vector<SequenceChunk> chunks;
    first_row_.assign(1, 0);
    for (const ScheduledChunk& c : out.chunks) {
      const auto tokens = std::span<const int32_t>(c.seq->tokens).subspan(static_cast<size_t>(c.start), static_cast<size_t>(c.n));
      const int64_t rows = c.logit_rows();
      chunks.push_back({tokens, c.start, kv_.blocks(c.seq->id), rows > 0, std::max<int64_t>(rows, 1),
                        kv_.sliding_blocks(c.seq->id)});
      first_row_.push_back(first_row_.back() + rows);
    }
    const size_t need = static_cast<size_t>(first_row_.back()) * static_cast<size_t>(model_.config().vocab_size);
    // A scored prompt's step takes up to a row per token (96 MiB for 512 x 49,152): give that back once steps are small.
    if (logits_.capacity() > 4 * need && logits_.capacity() > kKeptLogitFloats) std::vector<float>().swap(logits_);
    logits_.resize(need);
    runner_->forward_batch(chunks, logits_.data());
    scheduler_.finish_step(out);
    count_step(out);
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
    metrics_.generated_tokens_total = sampling_.tokens_taken();
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
  EngineMetrics counters_;  // counted on the engine thread without a lock; publish_metrics() copies it
  RequestTable requests_{tokenizer_, model_.config().vocab_size, scheduler_, draft_batch_.get(),
                         {[this] { count_finished_request(); }, [this](RequestId id) { forget(id); }}};
  std::vector<float> logits_;  // [rows][vocab] of the current step: one per sampling chunk + one per draft
  static constexpr size_t kKeptLogitFloats = size_t{4} << 20;  // 16 MiB of logits kept between steps at most
  std::vector<int64_t> first_row_;  // chunk i's rows of logits_ start at first_row_[i]; the last entry is the count
  SamplingStage sampling_{requests_, scheduler_, tokenizer_, model_.config().vocab_size, counters_};
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

int64_t planned_kv_pool_bytes(const ModelConfig& config, const EngineOptions& options, const ModelConfig* draft) {
  const KVPoolRequest request = pool_request(config, options, draft);
  return kv_pool_bytes(config.kv_shape(), request, kv_pool_blocks(config.kv_shape(), request));
}

Engine::Engine(const Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(model, tokenizer, checked_options(model, options))) {
  // The engine thread's team is to be the only busy one (kernels/openmp_wait.h).
  release_this_threads_openmp_pool();
}
Engine::~Engine() = default;
std::optional<RequestId> Engine::submit(GenerationRequest request, EventCallback on_event) {
  return impl_->submit(ValidatedRequest(std::move(request), impl_->request_limits()), std::move(on_event));
}

std::optional<RequestId> Engine::submit_validated(ValidatedRequest request, EventCallback on_event) {
  return impl_->submit(std::move(request), std::move(on_event));
}
void Engine::cancel(RequestId id) { impl_->cancel(id); }
EngineMetrics Engine::metrics() const { return impl_->metrics(); }
void Engine::shutdown(bool finish_running) { impl_->shutdown(finish_running); }
const EngineOptions& Engine::options() const { return impl_->options(); }
const RequestLimits& Engine::request_limits() const { return impl_->request_limits(); }
const std::vector<std::pair<int64_t, double>>& Engine::step_cost_at_start() const { return impl_->step_cost_at_start(); }

}  // namespace kvserve

#include "grammar/constraint_compiler.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "grammar/spec_limits.h"
#include "grammar/xgrammar_backend.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Entry {
  bool done = false;
  std::shared_ptr<const CompiledConstraint> result;
  std::optional<ConstraintError> error;
  size_t bytes = 0;               // estimated, once done
  Clock::time_point started;      // when its compile began
  std::list<std::string>::iterator use;  // its place in Shared::recency
};

}  // namespace

struct ConstraintCompiler::Shared : std::enable_shared_from_this<Shared> {
  ConstraintCompiler::CompileFunction compile_fn;  // null when unavailable
  std::optional<ConstraintError> unavailable;
  ConstraintLimits limits;
  std::mutex mutex;
  std::condition_variable compiled;
  std::map<std::string, std::shared_ptr<Entry>> cache;
  std::list<std::string> recency;  // cache keys, least recently used first
  std::vector<std::shared_ptr<Entry>> running;  // compiles in flight, overdue ones included
  size_t cached_bytes = 0;         // of the finished entries
  ConstraintCompilerStats stats;

  Clock::duration timeout() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits.compile_timeout_seconds));
  }

  // Compiles younger than the timeout: those hold the max_compiling slots.
  int64_t young(Clock::time_point now) const {
    return static_cast<int64_t>(
        std::count_if(running.begin(), running.end(), [&](const auto& e) { return now - e->started < timeout(); }));
  }

  // When the next young compile turns overdue and frees its slot.
  Clock::time_point next_overdue(Clock::time_point now) const {
    Clock::time_point next = Clock::time_point::max();
    for (const auto& e : running)
      if (now - e->started < timeout()) next = std::min(next, e->started + timeout());
    return next;
  }

  void run(const ConstraintSpec& spec, const std::shared_ptr<Entry>& entry) {
    std::shared_ptr<const CompiledConstraint> result;
    std::optional<ConstraintError> error;
    try {
      result = compile_fn(spec);
    } catch (const ConstraintError& e) {
      error = e;
    } catch (const std::exception& e) {  // e.g. bad_alloc: the server stays up
      error = ConstraintError(ConstraintError::Reason::kInvalid, std::string("compiling failed: ") + e.what());
    }
    std::lock_guard lock(mutex);
    const double seconds = std::chrono::duration<double>(Clock::now() - entry->started).count();
    entry->result = std::move(result);
    entry->error = std::move(error);
    entry->bytes = sizeof(Entry) + 2 * entry->use->size() + (entry->result ? entry->result->memory_bytes() : 0) +
                   (entry->error ? std::string(entry->error->what()).size() : 0);
    entry->done = true;
    running.erase(std::find(running.begin(), running.end(), entry));
    stats.compiles++;
    stats.compile_seconds += seconds;
    cached_bytes += entry->bytes;  // still cached: an unfinished entry is never evicted
    evict();
    compiled.notify_all();
  }

  // Drops the least recently used finished entries until both bounds hold.
  // A compile still running is kept (it has no size yet, and at most
  // max_compiling + max_overdue of them exist); a constraint a request holds
  // lives on in its shared_ptr.
  void evict() {
    auto it = recency.begin();
    while (it != recency.end() &&
           (cached_bytes > limits.max_cache_bytes || static_cast<int64_t>(cache.size()) > limits.max_cached)) {
      const auto found = cache.find(*it);
      if (!found->second->done) {
        ++it;
        continue;
      }
      cached_bytes -= found->second->bytes;
      cache.erase(found);
      it = recency.erase(it);
    }
  }

  [[noreturn]] void refuse_busy(Clock::time_point now) {
    stats.busy++;
    const int64_t overdue = static_cast<int64_t>(running.size()) - young(now);
    throw ConstraintError(ConstraintError::Reason::kBusy,
                          std::to_string(running.size()) + " grammars are compiling already (" + std::to_string(overdue) +
                              " of them past the " + std::to_string(static_cast<int>(limits.compile_timeout_seconds)) +
                              " s timeout); retry shortly");
  }

  // Waits (until `deadline`) for a compile slot: fewer than max_compiling
  // young compiles, and fewer than max_compiling + max_overdue threads in all.
  // With every thread taken by compiles that outlived the timeout, refuses at once.
  void wait_for_slot(std::unique_lock<std::mutex>& lock, Clock::time_point deadline) {
    for (Clock::time_point now = Clock::now();; now = Clock::now()) {
      if (static_cast<int64_t>(running.size()) >= limits.max_compiling + limits.max_overdue) refuse_busy(now);
      if (young(now) < limits.max_compiling) return;
      if (now >= deadline) refuse_busy(now);
      compiled.wait_until(lock, std::min(deadline, next_overdue(now)));
    }
  }

  std::shared_ptr<Entry> start(const ConstraintSpec& spec, const std::string& key) {
    auto entry = std::make_shared<Entry>();
    entry->started = Clock::now();
    cache.emplace(key, entry);
    entry->use = recency.insert(recency.end(), key);
    running.push_back(entry);
    evict();
    // Detached: a compile past the timeout finishes in the background (and
    // is cached); the thread holds the shared state alive.
    std::thread([shared = shared_from_this(), spec, entry] { shared->run(spec, entry); }).detach();
    return entry;
  }
};

ConstraintCompiler::ConstraintCompiler(const Tokenizer& tokenizer, int32_t vocab_size, ConstraintLimits limits,
                                       int threads)
    : limits_(limits), shared_(std::make_shared<Shared>()) {
  shared_->limits = limits;
  try {
    auto backend = std::make_shared<XGrammarBackend>(tokenizer, vocab_size, threads);
    shared_->compile_fn = [backend](const ConstraintSpec& spec) { return backend->compile(spec); };
  } catch (const ConstraintError& e) {
    shared_->unavailable = e;
  }
}

ConstraintCompiler::ConstraintCompiler(CompileFunction compile, ConstraintLimits limits)
    : limits_(limits), shared_(std::make_shared<Shared>()) {
  shared_->limits = limits;
  shared_->compile_fn = std::move(compile);
}

ConstraintCompiler::~ConstraintCompiler() = default;

std::shared_ptr<const CompiledConstraint> ConstraintCompiler::compile(const ConstraintSpec& spec) {
  if (shared_->unavailable) throw *shared_->unavailable;
  const std::string key = spec.key();
  const auto deadline = Clock::now() + shared_->timeout();
  std::unique_lock lock(shared_->mutex);
  shared_->stats.requests++;
  std::shared_ptr<Entry> entry;
  if (auto it = shared_->cache.find(key); it != shared_->cache.end()) {
    entry = it->second;
    shared_->recency.splice(shared_->recency.end(), shared_->recency, entry->use);
    shared_->stats.cache_hits++;
  } else {
    lock.unlock();
    check_spec_limits(spec, limits_);  // before any compile, off the lock: a walk as cheap as a parse
    lock.lock();
    if (auto again = shared_->cache.find(key); again != shared_->cache.end()) {
      entry = again->second;  // another requester started it meanwhile
    } else {
      shared_->wait_for_slot(lock, deadline);
      entry = shared_->start(spec, key);
    }
  }
  if (!shared_->compiled.wait_until(lock, deadline, [&] { return entry->done; })) {
    shared_->stats.timeouts++;
    throw ConstraintError(ConstraintError::Reason::kTimeout,
                          std::string("compiling the ") + constraint_kind_name(spec.kind) + " took longer than " +
                              std::to_string(static_cast<int>(limits_.compile_timeout_seconds)) +
                              " s; simplify it (or retry: the compile goes on and is cached when done)");
  }
  if (entry->error) throw *entry->error;
  return entry->result;
}

ConstraintCompilerStats ConstraintCompiler::stats() const {
  std::lock_guard lock(shared_->mutex);
  ConstraintCompilerStats out = shared_->stats;
  out.running = static_cast<int64_t>(shared_->running.size());
  out.cached = static_cast<int64_t>(shared_->cache.size());
  out.cached_bytes = shared_->cached_bytes;
  return out;
}

}  // namespace kvserve

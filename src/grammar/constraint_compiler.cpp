#include "grammar/constraint_compiler.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "grammar/xgrammar_backend.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Entry {
  bool done = false;
  std::shared_ptr<const CompiledConstraint> result;
  std::optional<ConstraintError> error;
};

}  // namespace

struct ConstraintCompiler::Shared {
  std::unique_ptr<XGrammarBackend> backend;  // null when unavailable
  std::optional<ConstraintError> unavailable;
  std::mutex mutex;
  std::condition_variable compiled;
  std::map<std::string, std::shared_ptr<Entry>> cache;
  std::deque<std::string> order;  // cache keys, oldest first
  int64_t compiling = 0;
  ConstraintCompilerStats stats;

  void run(const ConstraintSpec& spec, const std::shared_ptr<Entry>& entry) {
    const auto start = Clock::now();
    std::shared_ptr<const CompiledConstraint> result;
    std::optional<ConstraintError> error;
    try {
      result = backend->compile(spec);
    } catch (const ConstraintError& e) {
      error = e;
    } catch (const std::exception& e) {  // e.g. bad_alloc: the server stays up
      error = ConstraintError(ConstraintError::Reason::kInvalid, std::string("compiling failed: ") + e.what());
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::lock_guard lock(mutex);
    entry->result = std::move(result);
    entry->error = std::move(error);
    entry->done = true;
    compiling--;
    stats.compiles++;
    stats.compile_seconds += seconds;
    compiled.notify_all();
  }

  void evict_oldest(int64_t max_cached) {
    while (static_cast<int64_t>(order.size()) > max_cached) {
      auto it = cache.find(order.front());
      if (it != cache.end() && !it->second->done) break;  // still compiling: keep for now
      if (it != cache.end()) cache.erase(it);
      order.pop_front();
    }
  }
};

ConstraintCompiler::ConstraintCompiler(const Tokenizer& tokenizer, int32_t vocab_size, ConstraintLimits limits,
                                       int threads)
    : limits_(limits), shared_(std::make_shared<Shared>()) {
  try {
    shared_->backend = std::make_unique<XGrammarBackend>(tokenizer, vocab_size, threads);
  } catch (const ConstraintError& e) {
    shared_->unavailable = e;
  }
}

ConstraintCompiler::~ConstraintCompiler() = default;

std::shared_ptr<const CompiledConstraint> ConstraintCompiler::compile(const ConstraintSpec& spec) {
  if (shared_->unavailable) throw *shared_->unavailable;
  const char* what = constraint_kind_name(spec.kind);
  if (spec.size_bytes() > limits_.max_spec_bytes)
    throw ConstraintError(ConstraintError::Reason::kTooLarge,
                          std::string("the ") + what + " has " + std::to_string(spec.size_bytes()) +
                              " bytes; this server compiles at most " + std::to_string(limits_.max_spec_bytes));
  if (spec.choices.size() > limits_.max_choices)
    throw ConstraintError(ConstraintError::Reason::kTooLarge,
                          "at most " + std::to_string(limits_.max_choices) + " choices are accepted, got " +
                              std::to_string(spec.choices.size()));
  const std::string key = spec.key();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(limits_.compile_timeout_seconds));
  std::unique_lock lock(shared_->mutex);
  shared_->stats.requests++;
  std::shared_ptr<Entry> entry;
  if (auto it = shared_->cache.find(key); it != shared_->cache.end()) {
    entry = it->second;
    shared_->stats.cache_hits++;
  } else {
    // A full compile queue is waited on for a while (a burst of new schemas), then refused.
    if (!shared_->compiled.wait_until(lock, deadline, [&] { return shared_->compiling < limits_.max_compiling; }))
      throw ConstraintError(ConstraintError::Reason::kBusy,
                            std::to_string(shared_->compiling) + " grammars are compiling already; retry shortly");
    entry = std::make_shared<Entry>();
    shared_->cache.emplace(key, entry);
    shared_->order.push_back(key);
    shared_->evict_oldest(limits_.max_cached);
    shared_->compiling++;
    // Detached: a compile past the timeout finishes in the background (and
    // is cached); the thread holds the shared state alive.
    std::thread([shared = shared_, spec, entry] { shared->run(spec, entry); }).detach();
  }
  if (!shared_->compiled.wait_until(lock, deadline, [&] { return entry->done; })) {
    shared_->stats.timeouts++;
    throw ConstraintError(ConstraintError::Reason::kTimeout,
                          std::string("compiling the ") + what + " took longer than " +
                              std::to_string(static_cast<int>(limits_.compile_timeout_seconds)) +
                              " s; simplify it (or retry: the compile goes on and is cached when done)");
  }
  if (entry->error) throw *entry->error;
  return entry->result;
}

ConstraintCompilerStats ConstraintCompiler::stats() const {
  std::lock_guard lock(shared_->mutex);
  return shared_->stats;
}

}  // namespace kvserve

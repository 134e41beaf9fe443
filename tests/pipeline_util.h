#pragma once
// A pipeline of in-process ranks for tests (parallel/loopback_communicator.h):
// rank 0's stage of a model file for the engine, and a thread per later rank
// running its stage until the engine (or the test) shuts the pipeline down.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "parallel/loopback_communicator.h"
#include "parallel/pipeline_stage.h"

namespace kvserve::pipeline_test {

class LoopbackPipeline {
 public:
  LoopbackPipeline(const std::string& path, int ranks, std::chrono::milliseconds timeout = std::chrono::seconds(30))
      : group_(ranks), timeout_(timeout) {
    first_ = Model::load(path, ModelLoadOptions{.pipeline_rank = 0, .pipeline_ranks = ranks});
    for (int r = 1; r < ranks; ++r) {
      stages_.push_back(Model::load(path, ModelLoadOptions{.pipeline_rank = r, .pipeline_ranks = ranks}));
      errors_.emplace_back();
    }
    for (int r = 1; r < ranks; ++r)
      threads_.emplace_back([this, r] {
        try {
          run_pipeline_stage(*stages_[static_cast<size_t>(r - 1)], group_.rank(r), timeout_);
        } catch (const std::exception& e) {
          errors_[static_cast<size_t>(r - 1)] = e.what();
        }
      });
  }
  ~LoopbackPipeline() { finish(); }
  // Ends the pipeline and joins the stages; every engine over it must be gone.
  void finish() {
    if (!finished_) end_pipeline(group_.rank(0), timeout_);
    finished_ = true;
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }

  const Model& first_stage() const { return *first_; }
  const Model& stage(int rank) const { return rank == 0 ? *first_ : *stages_[static_cast<size_t>(rank - 1)]; }
  Communicator& comm(int rank) { return group_.rank(rank); }
  PipelineOptions options() { return {&group_.rank(0), timeout_, nullptr}; }
  EngineOptions engine_options(EngineOptions base) {
    base.pipeline = options();
    return base;
  }
  // A later rank's error, after finish(); "" when it ended normally.
  const std::string& error(int rank) const { return errors_[static_cast<size_t>(rank - 1)]; }

 private:
  LoopbackGroup group_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Model> first_;
  std::vector<std::unique_ptr<Model>> stages_;
  std::vector<std::string> errors_;
  std::vector<std::thread> threads_;
  bool finished_ = false;
};

}  // namespace kvserve::pipeline_test

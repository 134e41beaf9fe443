#pragma once
// --pipeline-parallel N for run and serve (docs/scaling.md): started as
// `mpirun -np N kvserve ...`, every process parses the same flags; rank 0
// runs the subcommand over the model's first layers, the other ranks run
// their stage until rank 0 is done. Without MPI in the build the flag is
// refused with what to do.
#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace kvserve::cli {

struct PipelineFlags {
  int ranks = 1;
  double timeout_seconds = 60;
};

void add_pipeline_flags(CLI::App* cmd, PipelineFlags& flags);

// One process's part of a pipeline (or of none, with --pipeline-parallel 1).
class PipelineSession {
 public:
  // Starts MPI when flags.ranks > 1. Throws kvserve::Error when kvserve was
  // built without MPI, was not started by mpirun, or mpirun started another
  // number of processes.
  explicit PipelineSession(const PipelineFlags& flags);
  ~PipelineSession();

  bool active() const { return comm_ != nullptr; }
  int rank() const;
  // `base` with this rank's share of the layers.
  ModelLoadOptions load_options(ModelLoadOptions base = {}) const;
  // The engine's pipeline options (rank 0); on_failure reports a lost rank.
  PipelineOptions engine_options(std::function<void(const std::string&)> on_failure = nullptr) const;
  // Rank > 0: loads this rank's layers of `model_path`, runs the stage until
  // rank 0 shuts it down, prints what it held and sent.
  void run_stage(const std::string& model_path, ModelLoadOptions base = {}) const;
  // Rank 0, after the engine is gone: what this rank held and sent.
  void report(const Model& stage) const;
  // Runs `body`, then (rank 0) ends the pipeline; on an exception prints it
  // and ends every rank (MPI_Abort), so that a failure on one rank never
  // leaves the others waiting.
  void guard(const std::function<void()>& body);

 private:
  PipelineFlags flags_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace kvserve::cli

#pragma once
// Rank 0's side of pipeline parallelism (docs/scaling.md). Rank 0 runs the
// whole engine (tokenization, scheduling, sampling, HTTP) over a model that
// holds only the first stage's layers; each step it runs them, sends the
// step's plan and activations to rank 1, and waits for the logits that the
// last rank sends back. The other ranks run run_pipeline_stage().
#include <memory>

#include "parallel/communicator.h"
#include "parallel/model_runner.h"
#include "parallel/pipeline_options.h"

namespace kvserve {

// The first stage as the engine's ModelRunner. The constructor sends the
// setup and waits for every rank to answer; throws kvserve::Error when one
// does not in time or loaded another model. The destructor tells the other
// ranks to stop (unless the pipeline broke).
std::unique_ptr<ModelRunner> make_pipeline_head(const Model& first_stage, const KVPoolShape& pool,
                                                const PipelineOptions& options);

}  // namespace kvserve

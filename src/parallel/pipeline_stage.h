#pragma once
// A non-zero rank of a pipeline (docs/scaling.md): for each engine rank 0
// creates (a benchmark runs several, one after the other), mirrors its KV
// pool for this rank's layers and executes the steps it plans, in order,
// until that engine ends; returns when rank 0 ends the pipeline
// (end_pipeline). Rank r runs its layers over the activations from rank
// r - 1 and sends its own to rank r + 1; the last rank runs the output head
// and sends the wanted logits rows to rank 0.
#include <chrono>
#include <cstdint>

#include "model/model.h"
#include "parallel/communicator.h"

namespace kvserve {

struct PipelineStageStats {
  int64_t steps = 0;   // steps executed
  int64_t tokens = 0;  // token rows that went through this rank's layers
};

// Waits for rank 0 without limit (an idle server sends nothing), but a send
// to another rank must complete within `timeout`. Throws kvserve::Error when the setup does not match this rank's
// model (after telling rank 0 why) or a send fails; a step whose layers fail
// is reported to rank 0 as an error reply and the loop goes on.
PipelineStageStats run_pipeline_stage(const Model& stage, Communicator& comm, std::chrono::milliseconds timeout);

// Rank 0, once its last engine is gone: every run_pipeline_stage returns.
void end_pipeline(Communicator& comm, std::chrono::milliseconds timeout);

}  // namespace kvserve

#pragma once
// How rank 0's engine reaches the other pipeline stages (docs/scaling.md):
// plain settings, apart from the pipeline itself (pipeline_head.h), so that
// the engine's public options carry them without the model runner's headers.
#include <chrono>
#include <functional>
#include <string>

namespace kvserve {

class Communicator;  // parallel/communicator.h

struct PipelineOptions {
  Communicator* comm = nullptr;  // null: no pipeline; else rank 0 of the ranks running the other stages
  // Every send and reply must complete within this: a rank that is down,
  // stopped or unreachable fails the step with an error naming it.
  std::chrono::milliseconds timeout{60000};
  // Called once, on the engine thread, when a rank is lost (timeout or
  // transport error): the pipeline refuses every later step.
  std::function<void(const std::string& error)> on_failure;
};

}  // namespace kvserve

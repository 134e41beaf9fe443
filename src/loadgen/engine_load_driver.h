#pragma once
// Replays a workload through an in-process Engine under one of three
// schedules (`kvserve bench --serving` without --url):
//   static      batches of `concurrency` requests in arrival order, each batch waits for its slowest;
//               padded: every sequence computed until the batch's longest is done (the classic
//               fixed-shape batch); early exit: finished sequences leave the batch
//   continuous  requests join and leave the running batch every step
//   +prefix     continuous, with cached prefix blocks reused
#include <optional>
#include <string>
#include <vector>

#include "loadgen/serving_stats.h"
#include "loadgen/workload.h"
#include "engine/engine.h"
#include "grammar/constraint_compiler.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace kvserve::loadgen {

enum class Schedule { kStatic, kStaticEarlyExit, kContinuous, kContinuousPrefix };
const char* schedule_name(Schedule s);

struct EngineLoadRun {
  std::vector<RequestTiming> timings;  // one per work item, in workload order
  EngineMetrics metrics;               // the engine's counters at the end
  double cpu_s = 0;                    // CPU seconds this process used during the run (all threads)
};

// Builds a fresh engine (`concurrency` running sequences, a KV pool sized for
// the workload) and runs every item, greedy and ignoring EOS, so that each
// generates exactly its output_tokens. Items need prompt_ids (a workload made
// with a tokenizer). Throws kvserve::Error if the engine refuses a request.
struct EnginePool {
  KVType kv_type = KVType::F32;
  int64_t kv_memory_bytes = 0;  // 0: room for every running sequence at the workload's longest
  // A structured workload: each request compiles `constraint` through the
  // compiler's cache before it is submitted (as the server does) and follows it.
  ConstraintCompiler* compiler = nullptr;
  std::optional<ConstraintSpec> constraint;
  // The model is rank 0's stage of a pipeline over these ranks (docs/scaling.md); each run is one engine over it.
  PipelineOptions pipeline;
};

// The engine options run_engine_load uses (exposed so a front end can print the pool it gets).
EngineOptions engine_options(const std::vector<WorkItem>& items, int concurrency, Schedule schedule, const EnginePool& pool);

EngineLoadRun run_engine_load(const Model& model, const Tokenizer& tokenizer, const std::vector<WorkItem>& items,
                              int concurrency, Schedule schedule, const EnginePool& pool = {});

}  // namespace kvserve::loadgen

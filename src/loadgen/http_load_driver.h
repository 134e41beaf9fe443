#pragma once
// Replays a workload against a running OpenAI-compatible server
// (`kvserve bench --serving --url URL`): each request is sent at its arrival
// time, with at most `concurrency` in flight (one client thread each), as a
// streamed /v1/completions request timed at the client.
#include <string>
#include <vector>

#include "loadgen/openai_client.h"
#include "loadgen/serving_stats.h"
#include "loadgen/workload.h"

namespace kvserve::loadgen {

struct HttpLoadOptions {
  std::string url;                   // http://host:port[/prefix]
  std::string model;                 // "" : the first model GET /v1/models lists
  int concurrency = 16;              // requests in flight at most
  ClientOptions client;
};

struct HttpLoadRun {
  std::string model;                       // the model name sent
  std::vector<RequestTiming> timings;      // one per work item, in workload order
  int64_t reported_prompt_tokens = 0;      // the sum of usage.prompt_tokens over the requests that reported it
  int64_t requests_with_usage = 0;
};

// Throws kvserve::Error with the first failure (server unreachable, an HTTP
// error, a malformed stream, a timeout); the requests in flight are abandoned.
HttpLoadRun run_http_load(const HttpLoadOptions& options, const std::vector<WorkItem>& items);

}  // namespace kvserve::loadgen

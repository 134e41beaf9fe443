#pragma once
// A minimal client of an OpenAI-compatible server for the serving benchmark:
// the model list, and one streamed /v1/completions request timed chunk by
// chunk at the client. Works against any such server: the extension fields it
// sends for exact output lengths (ignore_eos, min_tokens, as vLLM's benchmark
// does) may be ignored, and tokens are counted from `usage` when the server
// sends it (stream_options.include_usage), else one per non-empty text chunk.
//
// Not thread-safe: one client per thread.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "loadgen/http_url.h"
#include "loadgen/serving_stats.h"
#include "loadgen/workload.h"

namespace httplib {
class Client;
}

namespace kvserve::loadgen {

struct ClientOptions {
  std::string api_key;               // sent as "Authorization: Bearer <key>" when set
  double timeout_s = 300;            // connecting, and waiting for any byte of a response
};

struct CompletionResult {
  RequestTiming timing;              // times since the run's start; arrival_s is left 0
  int64_t prompt_tokens = -1;        // from usage; -1 when the server sent none
  bool usage_reported = false;       // output_tokens came from usage (else from chunks)
};

class OpenAiClient {
 public:
  OpenAiClient(HttpUrl url, ClientOptions options);
  ~OpenAiClient();
  OpenAiClient(const OpenAiClient&) = delete;
  OpenAiClient& operator=(const OpenAiClient&) = delete;

  // The first model GET /v1/models lists. Throws kvserve::Error when the
  // server cannot be reached, answers an HTTP error, or lists none.
  std::string first_model_id();

  // Streams one greedy completion of `item` (max_tokens = its output_tokens).
  // Throws kvserve::Error on a connection failure or timeout, an HTTP error,
  // an SSE payload that is not JSON, an error chunk, or a stream cut short.
  // Returns early (the result incomplete) once `stop` is set.
  CompletionResult stream_completion(const std::string& model, const WorkItem& item,
                                     std::chrono::steady_clock::time_point run_start, const std::atomic<bool>& stop);

 private:
  HttpUrl url_;
  double timeout_s_;
  std::unique_ptr<httplib::Client> http_;
};

}  // namespace kvserve::loadgen

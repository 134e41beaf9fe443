#pragma once
// Sends a generation job's result: one JSON body, or a stream of events
// (Server-Sent Events, or NDJSON for Ollama's API), in the shape its
// ResponseEncoder writes.
#include <memory>

#include "server/client_connection.h"
#include "server/generation_job.h"
#include "server/response_encoder.h"
#include "server/server_metrics.h"

namespace httplib {
struct Response;
}

namespace kvserve::server {

// Waits for every choice to finish, then sets the response body. Throws
// ApiError (500 for an engine error, 503 for a request cancelled by shutdown).
// Checks the client every poll interval: one that hung up gets the job
// cancelled at once (its KV blocks freed) and is counted as a disconnect.
void send_whole_response(GenerationJob& job, ResponseEncoder& encoder, const ClientConnection& client,
                         ServerMetrics& metrics, httplib::Response& res);

// Hands the job to a chunked content provider that writes events as they
// come. A write that fails (the client went away) cancels the job at once.
void send_event_stream(std::shared_ptr<GenerationJob> job, std::unique_ptr<ResponseEncoder> encoder,
                       ServerMetrics& metrics, httplib::Response& res);

}  // namespace kvserve::server

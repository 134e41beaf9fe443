#include "server/generation_response.h"

#include <httplib.h>

#include "server/api_error.h"

namespace kvserve::server {
namespace {

// How long an HTTP thread waits for an event before checking on its client.
constexpr std::chrono::milliseconds kPollInterval{100};
// A stream idle this long gets a keep-alive (an SSE comment, or the encoder's
// own), so that a client that left while its request waited in the queue is
// noticed (and cancelled) early.
constexpr std::chrono::milliseconds kKeepAliveInterval{1000};
// The status logged for a request whose client left before the answer (nginx's 499).
constexpr int kClientClosedRequest = 499;

class EventStreamWriter {
 public:
  EventStreamWriter(std::shared_ptr<GenerationJob> job, std::unique_ptr<ResponseEncoder> encoder, ServerMetrics& metrics)
      : job_(std::move(job)), encoder_(std::move(encoder)), metrics_(metrics) {}

  // One call of the chunked content provider: false ends the response.
  bool pump(httplib::DataSink& sink) {
    try {
      if (!started_) {
        started_ = true;
        const std::string start = encoder_->stream_start();
        if (!start.empty() && !send(sink, start)) return false;
      }
      std::optional<ChoiceEvent> ev = job_->next(kPollInterval);
      if (!ev) return Clock::now() - last_write_ < kKeepAliveInterval || send(sink, encoder_->keep_alive());
      const std::string bytes = encoder_->stream_event(*ev);
      if (!bytes.empty() && !send(sink, bytes)) return false;
      if (!job_->done()) return true;
      if (!send(sink, encoder_->stream_end())) return false;
      sink.done();
      return true;
    } catch (const std::exception&) {  // nothing sensible can be sent mid-stream; end it
      job_->cancel();
      return false;
    }
  }

  void release(bool success) {
    if (!success) job_->cancel();
  }

 private:
  bool send(httplib::DataSink& sink, const std::string& data) {
    if (sink.write(data.data(), data.size())) {
      last_write_ = Clock::now();
      return true;
    }
    metrics_.client_disconnects++;
    job_->cancel();
    return false;
  }

  std::shared_ptr<GenerationJob> job_;
  std::unique_ptr<ResponseEncoder> encoder_;
  ServerMetrics& metrics_;
  bool started_ = false;
  Clock::time_point last_write_ = Clock::now();
};

}  // namespace

void send_whole_response(GenerationJob& job, ResponseEncoder& encoder, const ClientConnection& client,
                         ServerMetrics& metrics, httplib::Response& res) {
  std::vector<ChoiceResult> results(job.choices());
  Clock::time_point last_check = Clock::now();
  while (!job.done()) {
    if (std::optional<ChoiceEvent> ev = job.next(kPollInterval)) results[ev->choice].add(ev->event, ev->at);
    if (Clock::now() - last_check < kPollInterval) continue;
    last_check = Clock::now();
    if (client.closed()) {  // nobody to answer: free the KV blocks now
      metrics.client_disconnects++;
      job.cancel();
      res.status = kClientClosedRequest;
      return;
    }
  }
  for (const ChoiceResult& r : results) {
    if (r.finish_reason == "error") throw ApiError(500, "generation failed: " + r.error, {}, "server_error");
    if (r.finish_reason == "cancelled")
      throw ApiError(503, "the request was cancelled (the server is shutting down)", {}, "server_error");
  }
  res.set_content(dump_json(encoder.whole(results)), "application/json");
}

void send_event_stream(std::shared_ptr<GenerationJob> job, std::unique_ptr<ResponseEncoder> encoder,
                       ServerMetrics& metrics, httplib::Response& res) {
  const std::string content_type = encoder->content_type();
  auto writer = std::make_shared<EventStreamWriter>(std::move(job), std::move(encoder), metrics);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      content_type, [writer](size_t, httplib::DataSink& sink) { return writer->pump(sink); },
      [writer](bool success) { writer->release(success); });
}

}  // namespace kvserve::server

#include "loadgen/openai_client.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <cmath>

#include "loadgen/sse_parser.h"
#include "core/error.h"

namespace kvserve::loadgen {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxErrorBody = 4096;  // bytes of an HTTP error body kept for the message

// The message of an error body: OpenAI's {"error": {"message"}}, a bare
// {"error": "..."}, FastAPI's {"detail": ...}, else the text itself.
std::string error_message_of(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_object()) {
    const json e = j.value("error", json());
    if (e.is_object() && e.value("message", json()).is_string()) return e["message"];
    if (e.is_string()) return e;
    if (j.contains("detail")) return j["detail"].is_string() ? j["detail"].get<std::string>() : j["detail"].dump();
  }
  return body.substr(0, 300);
}

std::string http_failure(httplib::Error e, const std::string& what, double timeout_s) {
  switch (e) {
    case httplib::Error::Connection:
    case httplib::Error::ConnectionTimeout:
      return "cannot connect to " + what + " (is the server running, and is the URL right?)";
    case httplib::Error::Read:
      return "no answer from " + what + " (connection closed, or nothing received for " +
             std::to_string(static_cast<int>(timeout_s)) + " s; see --timeout)";
    case httplib::Error::Write: return "could not send the request to " + what + " (the connection was closed)";
    default: return what + ": HTTP client error " + httplib::to_string(e);
  }
}

std::string http_status_failure(int status, const std::string& what, const std::string& body) {
  std::string hint;
  if (status == 401 || status == 403) hint = " (pass the server's key with --api-key)";
  if (status == 404) hint = " (is this an OpenAI-compatible server? the API base is taken from --url)";
  return what + ": HTTP " + std::to_string(status) + ": " + error_message_of(body) + hint;
}

// Turns a completion stream's SSE events into a timed result.
class ChunkReader {
 public:
  ChunkReader(Clock::time_point run_start, std::string what) : run_start_(run_start), what_(std::move(what)) {}

  // Throws kvserve::Error for a payload that is not a completion chunk.
  void on_data(const std::string& data) {
    if (data == "[DONE]") {
      done_ = true;
      return;
    }
    const json chunk = json::parse(data, nullptr, false);
    if (!chunk.is_object())
      throw Error("malformed SSE from " + what_ + ": a data line is not a JSON object: " + data.substr(0, 200));
    if (chunk.contains("error")) throw Error(what_ + ": the server sent an error mid-stream: " + error_message_of(data));
    const double now = std::chrono::duration<double>(Clock::now() - run_start_).count();
    const json choices = chunk.value("choices", json::array());
    if (!choices.is_array()) throw Error("malformed SSE from " + what_ + ": `choices` is not a list: " + data.substr(0, 200));
    for (const json& choice : choices) on_choice(choice, now);
    const json usage = chunk.value("usage", json());
    if (usage.is_object() && usage.value("completion_tokens", json()).is_number_integer()) {
      result_.usage_reported = true;
      usage_completion_tokens_ = usage["completion_tokens"];
      const json prompt = usage.value("prompt_tokens", json());
      result_.prompt_tokens = prompt.is_number_integer() ? prompt.get<int64_t>() : -1;
    }
  }

  // The result once the body has ended; throws if the stream was cut short.
  CompletionResult finish(const SseParser& parser) {
    if (!done_ && !finished_)
      throw Error("the stream from " + what_ + " ended before `data: [DONE]` or a finish_reason (" +
                  std::to_string(result_.timing.output_tokens) + " text chunks received" +
                  (parser.has_partial_event() ? ", the last one incomplete)" : ")"));
    result_.timing.finish_s = std::chrono::duration<double>(Clock::now() - run_start_).count();
    if (result_.usage_reported) result_.timing.output_tokens = usage_completion_tokens_;
    return result_;
  }

 private:
  void on_choice(const json& choice, double now) {
    if (!choice.is_object()) throw Error("malformed SSE from " + what_ + ": a choice is not an object");
    const json text = choice.value("text", json());
    if (text.is_string() && !text.get_ref<const std::string&>().empty()) result_.timing.add_delivery(now, 1);
    if (!choice.value("finish_reason", json()).is_null()) finished_ = true;
  }

  Clock::time_point run_start_;
  std::string what_;
  CompletionResult result_;
  int64_t usage_completion_tokens_ = 0;
  bool done_ = false, finished_ = false;
};

json completion_body(const std::string& model, const WorkItem& item) {
  return {{"model", model},
          {"prompt", item.prompt},
          {"max_tokens", item.output_tokens},
          {"temperature", 0},
          {"stream", true},
          {"stream_options", {{"include_usage", true}}},
          // Extensions for exact output lengths (kvserve, vLLM); other servers ignore them.
          {"ignore_eos", true},
          {"min_tokens", item.output_tokens}};
}

}  // namespace

OpenAiClient::OpenAiClient(HttpUrl url, ClientOptions options)
    : url_(std::move(url)), timeout_s_(options.timeout_s), http_(std::make_unique<httplib::Client>(url_.origin())) {
  const auto seconds = static_cast<time_t>(options.timeout_s);
  const auto micros = static_cast<time_t>((options.timeout_s - std::floor(options.timeout_s)) * 1e6);
  http_->set_connection_timeout(seconds, micros);
  http_->set_read_timeout(seconds, micros);
  http_->set_write_timeout(seconds, micros);
  if (!options.api_key.empty()) http_->set_bearer_token_auth(options.api_key);
}

OpenAiClient::~OpenAiClient() = default;

std::string OpenAiClient::first_model_id() {
  const std::string what = "GET " + url_.endpoint("/models");
  httplib::Result r = http_->Get((url_.api_base + "/models").c_str());
  if (!r) throw Error(http_failure(r.error(), what, timeout_s_));
  if (r->status != 200) throw Error(http_status_failure(r->status, what, r->body));
  const json body = json::parse(r->body, nullptr, false);
  const json data = body.is_object() ? body.value("data", json()) : json();
  if (!data.is_array() || data.empty() || !data[0].is_object() || !data[0].value("id", json()).is_string())
    throw Error(what + " listed no model; name one with --model-name");
  return data[0]["id"];
}

CompletionResult OpenAiClient::stream_completion(const std::string& model, const WorkItem& item,
                                                 Clock::time_point run_start, const std::atomic<bool>& stop) {
  const std::string what = "POST " + url_.endpoint("/completions");
  httplib::Request req;
  req.method = "POST";
  req.path = url_.api_base + "/completions";
  req.body = completion_body(model, item).dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  int status = 0;
  std::string error_body, failure;
  SseParser parser;
  ChunkReader reader(run_start, what);
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    const std::string type = res.get_header_value("Content-Type");
    if (status != 200 || type.rfind("text/event-stream", 0) == 0) return true;
    failure = what + ": the answer is not a stream (Content-Type: " + type + "); does the server support \"stream\": true?";
    return false;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, std::min(n, kMaxErrorBody - std::min(kMaxErrorBody, error_body.size())));
      return true;
    }
    try {
      parser.feed({data, n}, [&](const std::string& d) { reader.on_data(d); });
    } catch (const Error& e) {
      failure = e.what();
      return false;
    }
    return !stop.load();
  };
  httplib::Result r = http_->send(req);
  if (!failure.empty()) throw Error(failure);
  if (stop.load()) return {};
  if (!r) throw Error(http_failure(r.error(), what, timeout_s_));
  if (status != 200) throw Error(http_status_failure(status, what, error_body.empty() ? r->body : error_body));
  return reader.finish(parser);
}

}  // namespace kvserve::loadgen

#pragma once
// An ApiServer over its own Engine on a free loopback port, served by a
// background thread: the fixture of the end-to-end server tests.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "server/api_error.h"
#include "server/api_server.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"

namespace kvserve::test_util {

// A random-weight model of a `kvserve synth` preset (layers 0: the preset's),
// written to a temporary file and loaded with its tokenizer.
struct SynthModel {
  explicit SynthModel(const std::string& preset = "tiny-llama", int layers = 0, const std::string& chat_template = "",
                      int context = 0) {
    SynthOptions o;
    o.preset = preset;
    o.layers = layers;
    o.chat_template = chat_template;
    o.context = context;
    o.output_path = file.path();
    synthesize_model(o);
    model = Model::load(file.path());
    tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(model->file()));
  }
  TempFile file{".gguf"};
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

// One Server-Sent Event: its `event:` name ("" when it has none) and its `data:`.
struct SseEvent {
  std::string event;
  std::string data;
};

// The events of an SSE body (comments and blank lines dropped).
inline std::vector<SseEvent> sse_events(const std::string& body) {
  std::vector<SseEvent> out;
  size_t start = 0, end;
  while ((end = body.find("\n\n", start)) != std::string::npos) {
    std::istringstream lines(body.substr(start, end - start));
    start = end + 2;
    SseEvent ev;
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("event: ", 0) == 0) ev.event = line.substr(7);
      else if (line.rfind("data: ", 0) == 0) ev.data += line.substr(6);
    }
    if (!ev.event.empty() || !ev.data.empty()) out.push_back(std::move(ev));
  }
  return out;
}

class TestServer {
 public:
  // The model and tokenizer must outlive the server.
  TestServer(const Model& model, const Tokenizer& tokenizer, const EngineOptions& engine_options = {},
             std::vector<std::string> api_keys = {}, const server::ConnectionGateLimits& connections = {},
             std::vector<std::string> cors_origins = {}, ChatTemplate chat_template = ChatTemplate::chatml())
      : TestServer(server_options(std::move(api_keys), connections, std::move(cors_origins)), model, tokenizer,
                   engine_options, std::move(chat_template)) {}
  // A server with these options (on a free port: `options.port` is ignored).
  TestServer(server::ServerOptions options, const Model& model, const Tokenizer& tokenizer,
             const EngineOptions& engine_options = {}, ChatTemplate chat_template = ChatTemplate::chatml()) {
    engine_ = std::make_unique<Engine>(model, tokenizer, engine_options);
    options.port = 0;
    server_ = std::make_unique<server::ApiServer>(*engine_, model, tokenizer, std::move(chat_template), std::move(options));
    port_ = server_->bind();
    listener_ = std::thread([this] { server_->listen(); });
    // Answered once the accept loop runs: a stop() before that would be lost (httplib 0.11).
    client().Get("/health");
  }
  ~TestServer() { stop(); }
  TestServer(const TestServer&) = delete;
  TestServer& operator=(const TestServer&) = delete;

  // The options of the other constructor: model id "tiny", the rest defaults.
  static server::ServerOptions server_options(std::vector<std::string> api_keys,
                                              const server::ConnectionGateLimits& connections,
                                              std::vector<std::string> cors_origins) {
    server::ServerOptions o;
    o.connections = connections;
    o.api_keys = std::move(api_keys);
    o.cors_origins = std::move(cors_origins);
    o.model_id = "tiny";
    return o;
  }

  // Graceful shutdown (requests in flight finish); the port stops listening.
  void stop() {
    if (!server_) return;
    server_->shutdown();
    listener_.join();
    server_.reset();
    engine_.reset();
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  // GET /metrics as name (with labels) -> value; empty when it fails.
  std::map<std::string, double> metrics() const {
    auto r = client().Get("/metrics");
    std::map<std::string, double> out;
    if (!r) return out;
    std::istringstream lines(r->body);
    std::string line;
    while (std::getline(lines, line))
      if (!line.empty() && line[0] != '#') out[line.substr(0, line.rfind(' '))] = std::stod(line.substr(line.rfind(' ') + 1));
    return out;
  }

 private:
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<server::ApiServer> server_;
  std::thread listener_;
  int port_ = 0;
};

// The ApiError a call throws (a test failure when it throws none).
template <class Call>
server::ApiError api_error_of(Call call) {
  try {
    call();
  } catch (const server::ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError was thrown";
  return server::ApiError(400, "");
}

// A test suite over one random-weight tiny-llama model (synth_), made once for the suite.
class SynthModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);  // as `kvserve serve` does: a vanished client fails a write
    synth_ = new SynthModel();
  }
  static void TearDownTestSuite() {
    delete synth_;
    synth_ = nullptr;
  }
  static inline SynthModel* synth_ = nullptr;
};

}  // namespace kvserve::test_util

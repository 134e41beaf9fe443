// Speculation through the server: the "speculative" request field (parsing
// and 400s naming the field), the `serve --spec` default, the same greedy
// text with and without it over HTTP (streamed too; n-gram and draft-model
// drafts), and the /metrics counters.
#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <thread>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/api_server.h"
#include "server/request_parser.h"
#include "test_util.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

class ServerSpeculation : public ::testing::Test {
 protected:
  void SetUp() override {
    test_util::write_synth_model(file_.path(), "tiny-llama");
    model_ = Model::load(file_.path());
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(model_->file()));
  }
  void TearDown() override {
    if (!server_) return;
    server_->shutdown();
    listener_.join();
  }
  void start(const SpeculationSettings& server_default, const Model* draft_model = nullptr) {
    EngineOptions eo;
    eo.draft_model = draft_model;
    engine_ = std::make_unique<Engine>(*model_, *tokenizer_, eo);
    server::ServerOptions o;
    o.port = 0;
    o.speculation = server_default;
    server_ = std::make_unique<server::ApiServer>(*engine_, *model_, *tokenizer_, ChatTemplate::chatml(), o);
    port_ = server_->bind();
    listener_ = std::thread([this] { server_->listen(); });
  }
  std::string post(const std::string& path, const json& body) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r ? r->body : "";
  }
  std::string completion_text(json body) const {
    return json::parse(post("/v1/completions", body))["choices"][0]["text"].get<std::string>();
  }
  static json greedy(const json& speculative) {
    json body = {{"prompt", "the cat sat on the mat, the cat sat on the mat, the cat sat on the"},
                 {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
    if (!speculative.is_null()) body["speculative"] = speculative;
    return body;
  }
  SpeculationSettings parse(const json& speculative, SpeculationSettings server_default = {},
                            bool has_draft_model = false) const {
    server::RequestParser parser(*tokenizer_, chat_template_, 256, server_default, has_draft_model);
    json body = {{"prompt", "hi"}, {"speculative", speculative}};
    return parser.parse(server::Endpoint::kCompletions, body).requests.at(0).request().speculation;
  }

  test_util::TempFile file_{".gguf"};
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ChatTemplate chat_template_ = ChatTemplate::chatml();
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<server::ApiServer> server_;
  std::thread listener_;
  int port_ = 0;
};

}  // namespace

TEST_F(ServerSpeculation, FieldSelectsModeAndK) {
  const SpeculationSettings server_default{SpeculativeMode::kNgram, 6, false};
  EXPECT_EQ(parse(nullptr).mode, SpeculativeMode::kNone);
  EXPECT_EQ(parse(nullptr, server_default).draft_k, 6);
  EXPECT_EQ(parse(true).mode, SpeculativeMode::kNgram);
  EXPECT_EQ(parse(false, server_default).mode, SpeculativeMode::kNone);
  const SpeculationSettings s = parse({{"draft_k", 3}, {"adaptive_k", true}});
  EXPECT_EQ(s.mode, SpeculativeMode::kNgram);
  EXPECT_EQ(s.draft_k, 3);
  EXPECT_TRUE(s.adaptive_k);
  EXPECT_EQ(parse({{"mode", "none"}}, server_default).mode, SpeculativeMode::kNone);
  EXPECT_EQ(parse({{"mode", "draft"}}, server_default, true).mode, SpeculativeMode::kDraftModel);
  EXPECT_EQ(parse({{"mode", "draft"}}, server_default, true).draft_k, 6);
  EXPECT_EQ(parse({{"mode", "auto"}}).mode, SpeculativeMode::kAuto);  // no draft model needed: prompt lookup or none
  EXPECT_EQ(parse({{"mode", "auto"}, {"draft_k", 8}}).draft_k, 8);
}

// `serve` defaults to auto, whose drafting follows measured step times: a
// seeded sampled request would then draw differently from run to run, so the
// default leaves it without speculation; asking for it explicitly still works.
TEST_F(ServerSpeculation, DefaultAutoSkipsSeededSampledRequests) {
  const SpeculationSettings server_default{SpeculativeMode::kAuto, 4, false};
  server::RequestParser parser(*tokenizer_, chat_template_, 256, server_default, false);
  const auto mode = [&](json body) {
    body["prompt"] = "hi";
    return parser.parse(server::Endpoint::kCompletions, body).requests.at(0).request().speculation.mode;
  };
  EXPECT_EQ(mode({{"temperature", 0.8}, {"seed", 7}}), SpeculativeMode::kNone);
  EXPECT_EQ(mode({{"temperature", 0.8}}), SpeculativeMode::kAuto);                 // no seed: nothing to repeat
  EXPECT_EQ(mode({{"temperature", 0}, {"seed", 7}}), SpeculativeMode::kAuto);      // greedy: same text anyway
  EXPECT_EQ(mode({{"temperature", 0.8}, {"seed", 7}, {"speculative", {{"mode", "auto"}}}}), SpeculativeMode::kAuto);
  EXPECT_EQ(mode({{"temperature", 0.8}, {"seed", 7}, {"speculative", true}}), SpeculativeMode::kNgram);
}

TEST_F(ServerSpeculation, BadFieldsAre400sNamingTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {"yes", "speculative"},
      {3, "speculative"},
      {{{"draft_k", 0}}, "speculative.draft_k"},
      {{{"draft_k", 33}}, "speculative.draft_k"},
      {{{"draft_k", "4"}}, "speculative.draft_k"},
      {{{"mode", "draft"}}, "speculative.mode"},
      {{{"mode", "fast"}}, "speculative.mode"},
      {{{"mode", 1}}, "speculative.mode"},
      {{{"adaptive_k", 1}}, "speculative.adaptive_k"},
      {{{"k", 4}}, "speculative.k"},
  };
  for (const auto& [value, param] : cases) {
    try {
      parse(value);
      ADD_FAILURE() << value.dump() << " was accepted";
    } catch (const server::ApiError& e) {
      EXPECT_EQ(e.status(), 400) << value.dump();
      EXPECT_EQ(e.param(), param) << value.dump() << ": " << e.what();
    }
  }
}

TEST_F(ServerSpeculation, SameGreedyTextWithAndWithoutAndMetricsCountDrafts) {
  start({});
  const std::string plain = completion_text(greedy(nullptr));
  EXPECT_EQ(completion_text(greedy(true)), plain);
  EXPECT_EQ(completion_text(greedy({{"draft_k", 7}, {"adaptive_k", true}})), plain);
  json streamed = greedy(true);
  streamed["stream"] = true;
  std::string text;
  const std::string body = post("/v1/completions", streamed);
  for (size_t at = body.find("data: {"); at != std::string::npos; at = body.find("data: {", at + 1))
    text += json::parse(body.substr(at + 6, body.find('\n', at) - at - 6))["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, plain);
  httplib::Client c("127.0.0.1", port_);
  const auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("kvserve_spec_acceptance_rate"), std::string::npos);
  EXPECT_EQ(metrics->body.find("kvserve_spec_draft_tokens_total 0\n"), std::string::npos);  // drafts were proposed
}

TEST_F(ServerSpeculation, ServeDefaultAppliesToRequestsWithoutTheField) {
  start({SpeculativeMode::kNgram, 4, false});
  const std::string spec = completion_text(greedy(nullptr));
  EXPECT_GT(engine_->metrics().spec_rounds, 0);
  const int64_t rounds = engine_->metrics().spec_rounds;
  EXPECT_EQ(completion_text(greedy(false)), spec);
  EXPECT_EQ(engine_->metrics().spec_rounds, rounds);  // "speculative": false turns it off
}

// Auto mode through the server: the engine measures its step cost before the
// first auto request (the server was not started with it), and the text is the
// plain greedy one whatever it chooses.
TEST_F(ServerSpeculation, AutoModeGivesTheSameGreedyTextAsWithout) {
  auto draft = Model::load(file_.path(), ModelLoadOptions{.max_layers = 1});
  start({}, draft.get());
  const std::string plain = completion_text(greedy(nullptr));
  EXPECT_EQ(completion_text(greedy({{"mode", "auto"}})), plain);
  EXPECT_EQ(completion_text(greedy({{"mode", "auto"}, {"draft_k", 12}})), plain);
}

TEST_F(ServerSpeculation, DraftModeWithoutADraftModelIsA400NamingTheMode) {
  start({});
  httplib::Client c("127.0.0.1", port_);
  const auto r = c.Post("/v1/completions", greedy({{"mode", "draft"}}).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  const json error = json::parse(r->body)["error"];
  EXPECT_EQ(error["param"], "speculative.mode");
  EXPECT_NE(error["message"].get<std::string>().find("start the server with --draft FILE"), std::string::npos)
      << r->body;
}

TEST_F(ServerSpeculation, DraftModeGivesTheSameGreedyTextAsWithout) {
  auto draft = Model::load(file_.path(), ModelLoadOptions{.max_layers = 1});
  start({}, draft.get());
  const std::string plain = completion_text(greedy(nullptr));
  EXPECT_EQ(engine_->metrics().spec_rounds, 0);
  EXPECT_EQ(completion_text(greedy({{"mode", "draft"}})), plain);
  EXPECT_EQ(completion_text(greedy({{"mode", "draft"}, {"draft_k", 7}, {"adaptive_k", true}})), plain);
  EXPECT_GT(engine_->metrics().spec_rounds, 0);
  EXPECT_GT(engine_->metrics().spec_draft_tokens, 0);
}

TEST_F(ServerSpeculation, ServeDefaultDraftModeAppliesToRequestsWithoutTheField) {
  auto draft = Model::load(file_.path(), ModelLoadOptions{.max_layers = 1});
  start({SpeculativeMode::kDraftModel, 4, false}, draft.get());
  const std::string spec = completion_text(greedy(nullptr));
  const int64_t rounds = engine_->metrics().spec_rounds;
  EXPECT_GT(rounds, 0);
  EXPECT_EQ(completion_text(greedy(false)), spec);
  EXPECT_EQ(engine_->metrics().spec_rounds, rounds);
}

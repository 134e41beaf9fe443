// The HTTP server end to end: an ApiServer on a free loopback port over the
// tiny synthesized model, driven by httplib::Client.
#include <gtest/gtest.h>

#include <future>
#include <optional>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "model/synth.h"
#include "server/api_server.h"
#include "server_harness.h"
#include "test_util.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

struct Stream {
  std::vector<json> chunks;  // the JSON of every `data:` line but [DONE]
  bool done = false;         // `data: [DONE]` arrived
  int status = 0;
};

// Splits an SSE body into its `data:` payloads (comments and blank lines dropped).
void parse_events(const std::string& body, Stream& out) {
  size_t start = 0, end;
  while ((end = body.find("\n\n", start)) != std::string::npos) {
    const std::string event = body.substr(start, end - start);
    start = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;
    const std::string data = event.substr(6);
    if (data == "[DONE]") out.done = true;
    else out.chunks.push_back(json::parse(data));
  }
}

std::string stream_text(const Stream& s, bool chat) {
  std::string text;
  for (const json& c : s.chunks)
    for (const json& choice : c["choices"]) text += chat ? choice["delta"]["content"].get<std::string>() : choice["text"].get<std::string>();
  return text;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);  // as `kvserve serve` does: a vanished client fails a write
    synth_ = new kvserve::test_util::SynthModel();
    model_ = synth_->model.get();
    tokenizer_ = synth_->tokenizer.get();
  }
  static void TearDownTestSuite() { delete synth_; }

  void start(EngineOptions engine_options = {}, std::vector<std::string> api_keys = {}) {
    server_ = std::make_unique<kvserve::test_util::TestServer>(*model_, *tokenizer_, engine_options, std::move(api_keys));
  }
  void SetUp() override {
    if (std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()).find("Custom") == std::string::npos)
      start();
  }
  void TearDown() override { stop(); }
  void stop() {
    if (server_) server_->stop();
  }

  httplib::Client client() const { return server_->client(); }
  httplib::Result post(const std::string& path, const json& body) const {
    return client().Post(path.c_str(), body.dump(), "application/json");
  }
  json post_ok(const std::string& path, const json& body) const {
    auto r = post(path, body);
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  }
  // Streams a POST; `keep_going` sees the body so far and may stop reading (dropping the connection).
  Stream post_stream(const std::string& path, const json& body,
                     const std::function<bool(const std::string&)>& keep_going = nullptr) const {
    httplib::Client c = client();
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    std::string received;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      received.append(data, n);
      return !keep_going || keep_going(received);
    };
    Stream out;
    auto r = c.send(req);
    out.status = r ? r->status : -static_cast<int>(r.error());
    parse_events(received, out);
    return out;
  }
  std::map<std::string, double> metrics() const { return server_->metrics(); }

  static json greedy_completion(int max_tokens) {
    return {{"model", "tiny"}, {"prompt", "the cat sat on the mat"}, {"max_tokens", max_tokens},
            {"temperature", 0}, {"ignore_eos", true}};
  }
  static json chat(int max_tokens) {
    return {{"messages", json::array({{{"role", "user"}, {"content", "hello there"}}})}, {"max_tokens", max_tokens},
            {"temperature", 0.9}, {"seed", 42}, {"ignore_eos", true}};
  }

  static kvserve::test_util::SynthModel* synth_;
  static Model* model_;
  static Tokenizer* tokenizer_;
  std::unique_ptr<kvserve::test_util::TestServer> server_;
};

kvserve::test_util::SynthModel* ServerTest::synth_ = nullptr;
Model* ServerTest::model_ = nullptr;
Tokenizer* ServerTest::tokenizer_ = nullptr;

}  // namespace

TEST_F(ServerTest, HealthModelsAndMetrics) {
  auto health = client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto models = client().Get("/v1/models");
  ASSERT_TRUE(models);
  const json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][0]["meta"]["context_length"], 256);
  post_ok("/v1/completions", greedy_completion(4));
  // The engine publishes its counters after the step that sent the final
  // event, so the answer can arrive a moment before "running" drops to 0.
  auto values = metrics();
  for (int i = 0; i < 400 && values.at("kvserve_requests_running") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    values = metrics();
  }
  EXPECT_EQ(values.at("kvserve_requests_running"), 0);
  EXPECT_GE(values.at("kvserve_generation_tokens_total"), 4);
  EXPECT_EQ(values.at("kvserve_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(values.at("kvserve_inter_token_latency_seconds_count"), 3);
  EXPECT_TRUE(values.count("kvserve_kv_blocks_free") && values.count("kvserve_prefix_cache_hit_rate"));
}

TEST_F(ServerTest, TokenizeAndDetokenizeRoundTrip) {
  const json t = post_ok("/tokenize", {{"content", "the cat sat"}});
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), tokenizer_->encode("the cat sat", false));
  EXPECT_EQ(post_ok("/detokenize", {{"tokens", t["tokens"]}})["content"], "the cat sat");
  const json pieces = post_ok("/tokenize", {{"content", "cat"}, {"with_pieces", true}});
  EXPECT_TRUE(pieces["tokens"][0].contains("piece"));
}

TEST_F(ServerTest, UsageReportsThePromptTokensThePrefixCacheHeld) {
  json body = greedy_completion(2);
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "the cat sat on the mat and the dog ";
  body["prompt"] = prompt;
  const json first = post_ok("/v1/completions", body);
  const json second = post_ok("/v1/completions", body);
  const int64_t prompt_tokens = first["usage"]["prompt_tokens"];
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // Every full 16-token block of the prompt was cached by the first request.
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens / 16 * 16);
}

// What a router needs (docs/scaling.md): /version (smg registers an HTTP worker
// only once it recognizes the engine) and vLLM's gauge names in /metrics next
// to kvserve's, with the prefix cache's hits counted in tokens.
TEST_F(ServerTest, VersionAndRouterMetrics) {
  auto version = client().Get("/version");
  ASSERT_TRUE(version);
  EXPECT_EQ(version->status, 200);
  EXPECT_FALSE(json::parse(version->body)["version"].get<std::string>().empty());
  json body = greedy_completion(2);
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "the cat sat on the mat and the dog ";
  body["prompt"] = prompt;
  post_ok("/v1/completions", body);
  const json second = post_ok("/v1/completions", body);
  const double cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].get<double>();
  ASSERT_GT(cached, 0);
  auto m = metrics();
  for (int i = 0; i < 400 && m.at("kvserve_requests_running") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = metrics();
  }
  const std::string label = "{model_name=\"tiny\"}";
  EXPECT_EQ(m.at("kvserve_prefix_cache_hit_tokens_total"), cached);
  EXPECT_EQ(m.at("vllm:prefix_cache_hits_total" + label), cached);
  EXPECT_EQ(m.at("kvserve_prefix_cache_query_tokens_total"), m.at("vllm:prefix_cache_queries_total" + label));
  EXPECT_GE(m.at("kvserve_prefix_cache_query_tokens_total"), 2 * cached);
  EXPECT_EQ(m.at("vllm:num_requests_running" + label), 0);
  EXPECT_EQ(m.at("vllm:num_requests_waiting" + label), 0);
  // Nothing runs, so no block is held (cached ones are reusable, not used).
  EXPECT_EQ(m.at("vllm:kv_cache_usage_perc" + label), 0);
  EXPECT_EQ(m.at("vllm:gpu_cache_usage_perc" + label), 0);
  const std::string config = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"" +
                             std::to_string(static_cast<int64_t>(m.at("kvserve_kv_blocks_total"))) +
                             "\",enable_prefix_caching=\"True\"}";
  EXPECT_EQ(m.count(config), 1u) << config;
}

TEST_F(ServerTest, CompletionShapeAndUsage) {
  const json r = post_ok("/v1/completions", greedy_completion(6));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "tiny");
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(r["choices"][0]["text"].is_string());
  const auto prompt_tokens = static_cast<int64_t>(tokenizer_->encode("the cat sat on the mat", tokenizer_->add_bos()).size());
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(r["usage"]["completion_tokens"], 6);
  EXPECT_EQ(r["usage"]["total_tokens"], prompt_tokens + 6);
  json echo = greedy_completion(6);
  echo["echo"] = true;
  EXPECT_EQ(post_ok("/v1/completions", echo)["choices"][0]["text"], "the cat sat on the mat" + r["choices"][0]["text"].get<std::string>());
}

// echo + logprobs (OpenAI's prompt scoring, what lm-eval's loglikelihood
// asks with max_tokens 0) and vLLM's prompt_logprobs: the prompt's tokens,
// null for the first, then the completion's.
TEST_F(ServerTest, EchoWithLogprobsScoresThePrompt) {
  const auto prompt_ids = tokenizer_->encode("the cat sat on the mat", tokenizer_->add_bos());
  const size_t n_prompt = prompt_ids.size();
  for (int max_tokens : {0, 3}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    json body = greedy_completion(max_tokens);
    body["echo"] = true;
    body["logprobs"] = 2;
    const json r = post_ok("/v1/completions", body);
    const json& lp = r["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), n_prompt + static_cast<size_t>(max_tokens));
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    for (size_t i = 1; i < lp["tokens"].size(); ++i) {
      EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
      EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);
      EXPECT_GE(lp["text_offset"][i].get<int64_t>(), lp["text_offset"][i - 1].get<int64_t>());
    }
    for (size_t i = 0; i < n_prompt; ++i) EXPECT_EQ(lp["tokens"][i], tokenizer_->token_bytes(prompt_ids[i]));
    EXPECT_EQ(r["usage"]["completion_tokens"], max_tokens);
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(r["choices"][0]["text"].get<std::string>().rfind("the cat sat on the mat", 0), 0u);
  }
  json vllm = greedy_completion(1);
  vllm["prompt_logprobs"] = 1;
  const json v = post_ok("/v1/completions", vllm)["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(v.size(), n_prompt);
  EXPECT_TRUE(v[0].is_null());
  for (size_t i = 1; i < n_prompt; ++i) {
    const json& own = v[i][std::to_string(prompt_ids[i])];
    EXPECT_GE(own["rank"].get<int64_t>(), 1);
    EXPECT_EQ(own["decoded_token"], tokenizer_->token_bytes(prompt_ids[i]));
    EXPECT_LE(v[i].size(), 2u);  // its own and the most likely (the same when it is the most likely)
  }
  vllm["prompt_logprobs"] = 21;
  EXPECT_EQ(client().Post("/v1/completions", vllm.dump(), "application/json")->status, 400);
}

TEST_F(ServerTest, ChatShapeNChoicesAndLogprobs) {
  json body = chat(5);
  body["n"] = 2;
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  const json r = post_ok("/v1/chat/completions", body);
  EXPECT_EQ(r["object"], "chat.completion");
  ASSERT_EQ(r["choices"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& c = r["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["message"]["role"], "assistant");
    ASSERT_EQ(c["logprobs"]["content"].size(), 5u);
    EXPECT_EQ(c["logprobs"]["content"][0]["top_logprobs"].size(), 3u);
    EXPECT_LE(c["logprobs"]["content"][0]["logprob"].get<double>(), 0.0);
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], 10);
  json completion = greedy_completion(3);
  completion["logprobs"] = 2;
  const json lp = post_ok("/v1/completions", completion)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), 3u);
  EXPECT_EQ(lp["token_logprobs"].size(), 3u);
  EXPECT_EQ(lp["text_offset"][0], 0);
}

// "n": 3 runs as one engine request with three sequences (one prefill);
// choice j is what n = 1 with seed + j gives, streamed or not.
TEST_F(ServerTest, NChoicesStreamingAndNonStreaming) {
  for (const bool is_chat : {false, true}) {
    json body = is_chat ? chat(6) : json{{"prompt", "once upon"}, {"max_tokens", 6}, {"temperature", 0.9},
                                         {"seed", 7}, {"ignore_eos", true}};
    const std::string path = is_chat ? "/v1/chat/completions" : "/v1/completions";
    const auto text_of = [is_chat](const json& choice) -> std::string {
      return is_chat ? choice["message"]["content"] : choice["text"];
    };
    const int64_t seed = body["seed"];
    const auto with = [](json b, const json& patch) {
      b.update(patch);
      return b;
    };
    body["n"] = 3;
    const json whole = post_ok(path, body);
    ASSERT_EQ(whole["choices"].size(), 3u);
    const json one = post_ok(path, with(body, {{"n", 1}}));
    EXPECT_EQ(whole["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);  // the prompt counts once
    EXPECT_EQ(whole["usage"]["completion_tokens"], 18);
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(whole["choices"][j]["index"], j);
      EXPECT_EQ(whole["choices"][j]["finish_reason"], "length");
      const json alone = post_ok(path, with(body, {{"n", 1}, {"seed", seed + static_cast<int64_t>(j)}}));
      EXPECT_EQ(text_of(whole["choices"][j]), text_of(alone["choices"][0])) << "choice " << j;
    }
    body["stream"] = true;
    const Stream s = post_stream(path, body);
    ASSERT_TRUE(s.done);
    std::vector<std::string> texts(3);
    std::vector<int> finals(3, 0);
    for (const json& chunk : s.chunks)
      for (const json& c : chunk["choices"]) {
        const size_t j = c["index"];
        ASSERT_LT(j, 3u);
        texts[j] += is_chat ? c["delta"]["content"].get<std::string>() : c["text"].get<std::string>();
        if (!c["finish_reason"].is_null()) finals[j]++;
      }
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(texts[j], text_of(whole["choices"][j])) << "choice " << j;
      EXPECT_EQ(finals[j], 1) << "choice " << j;
    }
  }
}

TEST_F(ServerTest, StreamingMatchesNonStreamingForTheSameSeed) {
  for (const bool is_chat : {false, true}) {
    json body = is_chat ? chat(12) : json{{"prompt", "once upon"}, {"max_tokens", 12}, {"temperature", 1.0},
                                          {"seed", 7}, {"ignore_eos", true}};
    const std::string path = is_chat ? "/v1/chat/completions" : "/v1/completions";
    const json whole = post_ok(path, body);
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    const Stream s = post_stream(path, body);
    EXPECT_EQ(s.status, 200);
    ASSERT_TRUE(s.done);
    ASSERT_GE(s.chunks.size(), 3u);
    const std::string want = is_chat ? whole["choices"][0]["message"]["content"] : whole["choices"][0]["text"];
    EXPECT_EQ(stream_text({{s.chunks.begin(), s.chunks.end() - 1}, true, 200}, is_chat), want);
    if (is_chat) {
      EXPECT_EQ(s.chunks.front()["choices"][0]["delta"]["role"], "assistant");
    }
    EXPECT_EQ(s.chunks.end()[-2]["choices"][0]["finish_reason"], "length");
    json usage = s.chunks.back()["usage"];
    // The stream's prompt was cached by the whole request: only that differs.
    EXPECT_GE(usage["prompt_tokens_details"]["cached_tokens"], whole["usage"]["prompt_tokens_details"]["cached_tokens"]);
    usage["prompt_tokens_details"] = whole["usage"]["prompt_tokens_details"];
    EXPECT_EQ(usage, whole["usage"]);
  }
}

TEST_F(ServerTest, StopStringsCutTheText) {
  const std::string full = post_ok("/v1/completions", greedy_completion(16))["choices"][0]["text"];
  // An ASCII character past the start, so that the stop string is whole UTF-8.
  size_t at = 1;
  while (at < full.size() && static_cast<unsigned char>(full[at]) >= 0x80) ++at;
  ASSERT_LT(at, full.size()) << full;
  const std::string stop = full.substr(at, 1);
  json body = greedy_completion(16);
  body["stop"] = json::array({stop});
  const json r = post_ok("/v1/completions", body);
  EXPECT_EQ(r["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServerTest, MalformedRequestsGet400NamingTheField) {
  struct Case {
    std::string path;
    std::string body;
    int status;
    std::string param;  // "" for an error without one
  };
  const std::string c = "/v1/completions", ch = "/v1/chat/completions";
  const std::string long_prompt(3000, 'x');
  const std::vector<Case> cases = {
      {c, "{not json", 400, ""},
      {c, "[1, 2]", 400, ""},
      {c, R"({"max_tokens": 4})", 400, "prompt"},
      {c, R"({"prompt": 5})", 400, "prompt"},
      {c, R"({"prompt": ""})", 400, "prompt"},
      {c, R"({"prompt": [1, -3]})", 400, "prompt"},
      {c, R"({"prompt": [99999]})", 400, "prompt"},
      {c, R"({"prompt": "hi", "max_tokens": -1})", 400, "max_tokens"},
      {c, R"({"prompt": "hi", "max_tokens": "ten"})", 400, "max_tokens"},
      {c, R"({"prompt": "hi", "max_tokens": 1000000000000})", 400, "max_tokens"},
      {c, R"({"prompt": "hi", "max_tokens": 255})", 400, "max_tokens"},
      {c, R"({"prompt": "hi", "temperature": -0.5})", 400, "temperature"},
      {c, R"({"prompt": "hi", "temperature": "hot"})", 400, "temperature"},
      {c, R"({"prompt": "hi", "top_p": 0})", 400, "top_p"},
      {c, R"({"prompt": "hi", "top_p": 1.5})", 400, "top_p"},
      {c, R"({"prompt": "hi", "top_k": 1.5})", 400, "top_k"},
      {c, R"({"prompt": "hi", "min_p": 2})", 400, "min_p"},
      {c, R"({"prompt": "hi", "presence_penalty": 9})", 400, "presence_penalty"},
      {c, R"({"prompt": "hi", "frequency_penalty": -3})", 400, "frequency_penalty"},
      {c, R"({"prompt": "hi", "repetition_penalty": 0})", 400, "repetition_penalty"},
      {c, R"({"prompt": "hi", "seed": "x"})", 400, "seed"},
      {c, R"({"prompt": "hi", "n": 0})", 400, "n"},
      {c, R"({"prompt": "hi", "n": 1000})", 400, "n"},
      {c, R"({"prompt": "hi", "stop": 3})", 400, "stop"},
      {c, R"({"prompt": "hi", "stop": [""]})", 400, "stop"},
      {c, R"({"prompt": "hi", "stream": "yes"})", 400, "stream"},
      {c, R"({"prompt": "hi", "logprobs": 99})", 400, "logprobs"},
      {c, R"({"prompt": "hi", "model": 7})", 400, "model"},
      {c, R"({"prompt": "hi", "suffix": "x"})", 400, "suffix"},
      {c, R"({"prompt": "hi", "logit_bias": {"one": 5}})", 400, "logit_bias"},
      {c, R"({"prompt": "hi", "logit_bias": {"1": 500}})", 400, "logit_bias"},
      {c, R"({"prompt": "hi", "stop_token_ids": [-3]})", 400, "stop_token_ids"},
      {c, R"({"prompt": "hi", "max_tokens": 4, "min_tokens": 5})", 400, "min_tokens"},
      {c, json{{"prompt", long_prompt}}.dump(), 400, "prompt"},
      {ch, R"({"prompt": "hi"})", 400, "messages"},
      {ch, R"({"messages": []})", 400, "messages"},
      {ch, R"({"messages": "hi"})", 400, "messages"},
      {ch, R"({"messages": [5]})", 400, "messages[0]"},
      {ch, R"({"messages": [{"content": "hi"}]})", 400, "messages[0].role"},
      {ch, R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content"},
      {ch, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400, "messages[0].content"},
      {ch, R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", 400, "top_logprobs"},
      {ch, R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 50})", 400, "top_logprobs"},
      {ch, R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]})", 400, "tools[0].function"},
      {"/tokenize", R"({"content": 5})", 400, "content"},
      {"/detokenize", R"({"tokens": [1, "a"]})", 400, "tokens"},
      {"/detokenize", R"({"tokens": [100000]})", 400, "tokens"},
      {"/v1/nothing", "{}", 404, ""},
  };
  for (const Case& k : cases) {
    auto r = client().Post(k.path.c_str(), k.body, "application/json");
    ASSERT_TRUE(r) << k.body;
    EXPECT_EQ(r->status, k.status) << k.path << " " << k.body << " -> " << r->body;
    const json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.contains("error")) << r->body;
    EXPECT_EQ(e["error"]["type"], "invalid_request_error") << k.body;
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_EQ(e["error"]["param"], k.param.empty() ? json(nullptr) : json(k.param)) << k.body << " -> " << r->body;
  }
  EXPECT_EQ(post_ok("/v1/completions", greedy_completion(2))["choices"].size(), 1u);  // still serving
}

TEST_F(ServerTest, AnyModelNameIsAccepted) {
  json body = greedy_completion(2);
  body["model"] = "gpt-4o";
  EXPECT_EQ(post_ok("/v1/completions", body)["model"], "tiny");
}

TEST_F(ServerTest, CustomApiKeyIsRequired) {
  start({}, {"sekret"});
  auto no_key = client().Get("/v1/models");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(json::parse(no_key->body)["error"]["type"], "authentication_error");
  httplib::Client c = client();
  c.set_bearer_token_auth("sekret");
  auto with_key = c.Get("/v1/models");
  ASSERT_TRUE(with_key);
  EXPECT_EQ(with_key->status, 200);
  auto health = client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServerTest, CustomFullQueueGets429WithRetryAfter) {
  EngineOptions o;
  o.max_queue = 1;
  o.max_running = 1;
  start(o);
  json body = greedy_completion(250 - 8);
  body["stream"] = true;
  std::atomic<bool> first_running{false}, release{false};
  auto hold = [&](std::atomic<bool>* started) {
    return [&release, started](const std::string& received) {
      if (started && received.find("data: ") != std::string::npos) *started = true;
      return !release.load();
    };
  };
  std::thread running([&] { post_stream("/v1/completions", body, hold(&first_running)); });
  for (int i = 0; i < 500 && !first_running; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(first_running);
  std::thread waiting([&] { post_stream("/v1/completions", body, hold(nullptr)); });
  for (int i = 0; i < 500 && metrics()["kvserve_requests_waiting"] < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // The tiny model may finish the held streams quickly, so a single probe can
  // land in a free slot: probe in concurrent bursts until one is refused.
  std::optional<httplib::Result> refused;
  for (int attempt = 0; attempt < 40 && !refused; ++attempt) {
    std::vector<std::future<httplib::Result>> burst;
    for (int i = 0; i < 3; ++i)
      burst.push_back(std::async(std::launch::async, [&] { return post("/v1/completions", greedy_completion(2)); }));
    for (auto& f : burst) {
      httplib::Result r = f.get();
      if (r && r->status == 429 && !refused) refused.emplace(std::move(r));
    }
  }
  release = true;
  running.join();
  waiting.join();
  ASSERT_TRUE(refused.has_value());
  const httplib::Response& response = **refused;
  EXPECT_EQ(response.status, 429);
  EXPECT_EQ(response.get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(response.body)["error"]["type"], "rate_limit_error");
}

TEST_F(ServerTest, ConcurrentStreamsWithEarlyDisconnects) {
  constexpr int kClients = 32;
  std::mt19937 rng(1234);
  std::vector<bool> quits(kClients, false);
  for (int i = 0; i < kClients / 3; ++i) quits[static_cast<size_t>(i)] = true;
  std::shuffle(quits.begin(), quits.end(), rng);
  std::vector<Stream> results(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      json body = i % 2 ? chat(40) : greedy_completion(40);
      body["stream"] = true;
      body["ignore_eos"] = true;
      const bool quit = quits[static_cast<size_t>(i)];
      auto keep_going = [quit](const std::string& got) {
        size_t events = 0;
        for (size_t at = got.find("data: "); at != std::string::npos; at = got.find("data: ", at + 1)) ++events;
        return !quit || events < 3;
      };
      results[static_cast<size_t>(i)] = post_stream(i % 2 ? "/v1/chat/completions" : "/v1/completions", body, keep_going);
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kClients; ++i)
    if (!quits[static_cast<size_t>(i)]) {
      EXPECT_TRUE(results[static_cast<size_t>(i)].done) << "client " << i << " status " << results[static_cast<size_t>(i)].status
                                                        << " chunks " << results[static_cast<size_t>(i)].chunks.size()
                                                        << (results[static_cast<size_t>(i)].chunks.empty() ? "" : results[static_cast<size_t>(i)].chunks.back().dump());
    }
  std::map<std::string, double> m;
  for (int i = 0; i < 200; ++i) {
    m = metrics();
    if (m["kvserve_requests_running"] == 0 && m["kvserve_requests_waiting"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(m["kvserve_requests_running"], 0);
  EXPECT_EQ(m["kvserve_requests_waiting"], 0);
  EXPECT_EQ(m["kvserve_kv_blocks_used"], 0);
  EXPECT_GE(m["kvserve_client_disconnects_total"], 1);
  EXPECT_EQ(post_ok("/v1/completions", greedy_completion(3))["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, ShutdownLetsRequestsInFlightFinish) {
  json body = greedy_completion(60);
  body["stream"] = true;
  std::atomic<bool> started{false};
  Stream s;
  std::thread streaming([&] {
    s = post_stream("/v1/completions", body, [&](const std::string& got) {
      if (got.find("data: ") != std::string::npos) started = true;
      return true;
    });
  });
  for (int i = 0; i < 500 && !started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(started);
  stop();
  streaming.join();
  EXPECT_TRUE(s.done);
  ASSERT_FALSE(s.chunks.empty());
  EXPECT_EQ(s.chunks.back().value("choices", json::array({{}}))[0].value("finish_reason", json()), "length")
      << s.chunks.back().dump();
  httplib::Client c = client();
  c.set_connection_timeout(1, 0);
  EXPECT_FALSE(c.Get("/health"));  // no longer listening
}

// Ollama's API: requests translated onto the chat and completions paths,
// hostile bodies refused with 400, the answer's NDJSON chunks and final
// object, the model's description (tags, show, ps) and the endpoints
// through the server.
#include <gtest/gtest.h>

#include <httplib.h>

#include <algorithm>
#include <sstream>

#include "server/ollama_encoder.h"
#include "server/ollama_models.h"
#include "server/ollama_request.h"
#include "server/request_parser.h"
#include "server_harness.h"
#include "tiny_vocab.h"

using namespace kvserve;
using namespace kvserve::server;
using json = nlohmann::json;

namespace {

json ollama_user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

ApiError ollama_chat_error(const json& body) {
  return test_util::api_error_of([&] { generation_from_ollama_chat(body, {}); });
}

ApiError ollama_generate_error(const json& body) {
  return test_util::api_error_of([&] { generation_from_ollama_generate(body, {}); });
}

json ollama_weather_tool() {
  const json parameters = {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}};
  return {{"type", "function"},
          {"function", {{"name", "get_weather"}, {"description", "Get the weather"}, {"parameters", parameters}}}};
}

// The lines of an NDJSON body, each parsed.
std::vector<json> ndjson_lines(const std::string& body) {
  std::vector<json> out;
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) out.push_back(json::parse(line));
  return out;
}

}  // namespace

TEST(OllamaRequest, ChatBecomesTheChatBodyItStandsFor) {
  const json body = {
      {"model", "tiny"},
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}},
        ollama_user("Weather in Paris?"),
        {{"role", "assistant"},
         {"content", ""},
         {"thinking", "Need the tool."},
         {"tool_calls", {{{"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}}}},
        {{"role", "tool"}, {"tool_name", "get_weather"}, {"content", "18 C"}},
        ollama_user("Thanks")}},
      {"tools", {ollama_weather_tool()}},
      {"options", {{"temperature", 0.5}, {"top_k", 5}, {"num_predict", 32}, {"repeat_penalty", 1.1},
                   {"stop", {"END"}}, {"seed", 7}, {"num_ctx", 2048}, {"mirostat", 1}}},
      {"think", false},
      {"keep_alive", "5m"}};
  const OllamaGeneration out = generation_from_ollama_chat(body, {});
  EXPECT_EQ(out.endpoint, Endpoint::kChat);
  EXPECT_FALSE(out.load_reason.has_value());
  const json& chat = out.body;
  EXPECT_EQ(chat["stream"], true);  // Ollama streams unless told not to
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_EQ(chat["top_k"], 5);
  EXPECT_EQ(chat["max_tokens"], 32);
  EXPECT_EQ(chat["repetition_penalty"], 1.1);
  EXPECT_EQ(chat["stop"], json::array({"END"}));
  EXPECT_EQ(chat["seed"], 7);
  EXPECT_FALSE(chat.contains("num_ctx"));
  EXPECT_FALSE(chat.contains("mirostat"));
  EXPECT_EQ(chat["chat_template_kwargs"], json({{"enable_thinking", false}}));
  EXPECT_EQ(chat["tools"], json::array({ollama_weather_tool()}));
  const json& messages = chat["messages"];
  ASSERT_EQ(messages.size(), 5u);
  EXPECT_EQ(messages[2]["reasoning_content"], "Need the tool.");
  const json& call = messages[2]["tool_calls"][0];
  EXPECT_EQ(call["function"]["arguments"], R"({"city":"Paris"})");  // OpenAI's: a JSON string
  EXPECT_EQ(messages[3]["tool_call_id"], call["id"]);  // the result answers the call of its tool_name
  EXPECT_EQ(messages[3]["name"], "get_weather");
  // The chat parser takes the body as it is.
  const Tokenizer tokenizer = test_util::tiny_bpe_tokenizer();
  const ChatTemplate chat_template = ChatTemplate::chatml();
  const ParsedRequest parsed = RequestParser(tokenizer, chat_template, 4096).parse(Endpoint::kChat, chat, MaxTokens::kAtMost);
  EXPECT_EQ(parsed.requests[0].request().max_tokens, 32);
  EXPECT_TRUE(parsed.stream);
}

TEST(OllamaRequest, ChatFormatThinkAndPrefill) {
  const json schema = {{"type", "object"}, {"properties", {{"b", {{"type", "integer"}}}, {"a", {{"type", "string"}}}}}};
  KeyOrderCapture::Copies copies;
  copies[{"format"}] = nlohmann::ordered_json::parse(R"({"type":"object","properties":{"b":{},"a":{}}})");
  const OllamaGeneration with_schema =
      generation_from_ollama_chat({{"messages", {ollama_user("hi")}}, {"format", schema}, {"think", "high"}}, copies);
  EXPECT_EQ(with_schema.body["json_schema"], schema);
  ASSERT_EQ(with_schema.schemas_in_order.count({"json_schema"}), 1u);  // the written order goes with it
  EXPECT_EQ(with_schema.body["reasoning_effort"], "high");
  EXPECT_TRUE(with_schema.thinking_asked);
  const OllamaGeneration json_mode = generation_from_ollama_chat({{"messages", {ollama_user("hi")}}, {"format", "json"}}, {});
  EXPECT_EQ(json_mode.body["response_format"], json({{"type", "json_object"}}));
  const OllamaGeneration prefill = generation_from_ollama_chat(
      {{"messages", {ollama_user("hi"), {{"role", "assistant"}, {"content", "Sure,"}}}}, {"stream", false}}, {});
  EXPECT_EQ(prefill.body["continue_final_message"], true);
  EXPECT_EQ(prefill.body["stream"], false);
  // No messages: Ollama's way to load a model (or to unload it with keep_alive 0).
  EXPECT_EQ(generation_from_ollama_chat({{"model", "tiny"}}, {}).load_reason, "load");
  EXPECT_EQ(generation_from_ollama_chat({{"messages", json::array()}, {"keep_alive", 0}}, {}).load_reason, "unload");
  EXPECT_EQ(generation_from_ollama_chat({{"messages", json::array()}, {"keep_alive", "0s"}}, {}).load_reason, "unload");
  EXPECT_EQ(generation_from_ollama_chat({{"messages", json::array()}, {"keep_alive", "-1"}}, {}).load_reason, "load");
  // num_predict <= 0: no limit; a negative seed: a random one.
  const OllamaGeneration unlimited =
      generation_from_ollama_chat({{"messages", {ollama_user("hi")}}, {"options", {{"num_predict", -1}, {"seed", -1}}}}, {});
  EXPECT_FALSE(unlimited.body.contains("max_tokens"));
  EXPECT_FALSE(unlimited.body.contains("seed"));
}

TEST(OllamaRequest, GenerateAsChatTurnRawPromptOrInfill) {
  const OllamaGeneration turn =
      generation_from_ollama_generate({{"prompt", "Why?"}, {"system", "Be brief."}, {"stream", false}}, {});
  EXPECT_EQ(turn.endpoint, Endpoint::kChat);
  EXPECT_EQ(turn.body["messages"],
            json({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Why?"}}}));
  const OllamaGeneration raw = generation_from_ollama_generate({{"prompt", "[INST] hi [/INST]"}, {"raw", true}}, {});
  EXPECT_EQ(raw.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(raw.body["prompt"], "[INST] hi [/INST]");
  const OllamaGeneration infill = generation_from_ollama_generate({{"prompt", "def f():"}, {"suffix", "  return x"}}, {});
  EXPECT_EQ(infill.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(infill.body["suffix"], "  return x");
  EXPECT_EQ(generation_from_ollama_generate({{"model", "tiny"}}, {}).load_reason, "load");
  EXPECT_EQ(generation_from_ollama_generate({{"prompt", ""}, {"keep_alive", 0}}, {}).load_reason, "unload");
  // A raw prompt runs to the context's end by default (completions' own default is 16 tokens).
  const Tokenizer tokenizer = test_util::tiny_bpe_tokenizer();
  const ChatTemplate chat_template = ChatTemplate::chatml();
  const RequestParser parser(tokenizer, chat_template, 256);
  const ParsedRequest parsed = parser.parse(Endpoint::kCompletions, raw.body, MaxTokens::kAtMost);
  EXPECT_EQ(parsed.requests[0].request().max_tokens, 256 - static_cast<int64_t>(parsed.requests[0].request().prompt.size()));
  // A num_predict past the context is cut to what the prompt leaves, as Ollama does.
  json big = raw.body;
  big["max_tokens"] = int64_t{1} << 40;
  EXPECT_LT(parser.parse(Endpoint::kCompletions, big, MaxTokens::kAtMost).requests[0].request().max_tokens, 256);
  EXPECT_EQ(test_util::api_error_of([&] { parser.parse(Endpoint::kCompletions, big); }).param(), "max_tokens");
}

TEST(OllamaRequest, HostileBodiesAre400sNamingTheField) {
  const json user = ollama_user("hi");
  const std::vector<std::pair<json, std::string>> chat_cases = {
      {json::array(), ""},
      {{{"messages", "hi"}}, "messages"},
      {{{"messages", {42}}}, "messages[0]"},
      {{{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}, "messages[0].role"},
      {{{"messages", {{{"role", 7}, {"content", "x"}}}}}, "messages[0].role"},
      {{{"messages", {{{"role", "user"}, {"content", {1, 2}}}}}}, "messages[0].content"},
      {{{"messages", {{{"role", "user"}, {"content", "x"}, {"images", {"iVBOR"}}}}}}, "messages[0].images"},
      {{{"messages", {{{"role", "assistant"}, {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", "{}"}}}}}}}}}},
       "messages[0].tool_calls[0].function.arguments"},
      {{{"messages", {{{"role", "assistant"}, {"tool_calls", {{{"function", 3}}}}}}}}, "messages[0].tool_calls[0].function"},
      {{{"messages", {{{"role", "assistant"}, {"thinking", 5}}}}}, "messages[0].thinking"},
      {{{"messages", {user}}, {"options", "hot"}}, "options"},
      {{{"messages", {user}}, {"options", {{"temperature", "hot"}}}}, "options.temperature"},
      {{{"messages", {user}}, {"options", {{"num_predict", 1.5}}}}, "options.num_predict"},
      {{{"messages", {user}}, {"options", {{"num_predict", 1e300}}}}, "options.num_predict"},
      {{{"messages", {user}}, {"options", {{"top_k", 2.5}}}}, "options.top_k"},
      {{{"messages", {user}}, {"options", {{"num_ctx", "big"}}}}, "options.num_ctx"},
      {{{"messages", {user}}, {"format", 12}}, "format"},
      {{{"messages", {user}}, {"format", "yaml"}}, "format"},
      {{{"messages", {user}}, {"think", "max"}}, "think"},
      {{{"messages", {user}}, {"think", 1}}, "think"},
      {{{"messages", {user}}, {"keep_alive", {{"m", 5}}}}, "keep_alive"},
      {{{"messages", {user}}, {"keep_alive", "5 minutes"}}, "keep_alive"},
      {{{"messages", {user}}, {"keep_alive", std::string(100, '9') + "h"}}, "keep_alive"},
      {{{"messages", {user}}, {"stream", "yes"}}, "stream"},
      {{{"messages", {user}}, {"logprobs", true}}, "logprobs"},
  };
  for (const auto& [body, param] : chat_cases) {
    const ApiError e = ollama_chat_error(body);
    EXPECT_EQ(e.status(), 400) << body.dump();
    EXPECT_EQ(e.param(), param) << body.dump() << ": " << e.what();
  }
  const std::vector<std::pair<json, std::string>> generate_cases = {
      {{{"prompt", 3}}, "prompt"},
      {{{"prompt", "x"}, {"images", {"iVBOR"}}}, "images"},
      {{{"prompt", "x"}, {"template", "{{ .Prompt }}"}}, "template"},
      {{{"prompt", "x"}, {"context", {1, 2, 3}}}, "context"},
      {{{"prompt", "x"}, {"raw", "yes"}}, "raw"},
      {{{"prompt", "x"}, {"system", {1}}}, "system"},
      {{{"prompt", "x"}, {"suffix", false}}, "suffix"},
  };
  for (const auto& [body, param] : generate_cases) {
    const ApiError e = ollama_generate_error(body);
    EXPECT_EQ(e.status(), 400) << body.dump();
    EXPECT_EQ(e.param(), param) << body.dump() << ": " << e.what();
  }
  EXPECT_EQ(test_util::api_error_of([] { ollama_requested_model({{"model", 42}}); }).param(), "model");
  EXPECT_EQ(ollama_requested_model({{"prompt", "x"}}), "");
}

TEST(OllamaRequest, ParserErrorsNameOllamasFields) {
  const ApiError temperature = as_ollama_error(invalid("temperature", "temperature must be in [0, 2], got 9"));
  EXPECT_STREQ(temperature.what(), "options.temperature must be in [0, 2], got 9");
  EXPECT_EQ(temperature.param(), "options.temperature");
  EXPECT_EQ(as_ollama_error(invalid("repetition_penalty", "repetition_penalty must be in (0, 10]")).param(),
            "options.repeat_penalty");
  EXPECT_EQ(as_ollama_error(invalid("max_tokens", "x")).param(), "options.num_predict");
  EXPECT_EQ(as_ollama_error(invalid("messages[1].role", "bad")).param(), "messages[1].role");
  EXPECT_EQ(ollama_error_body(ApiError(404, "model \"x\" not found")), json({{"error", "model \"x\" not found"}}));
}

namespace {

// The encoder of an Ollama chat request parsed through the chat path.
struct OllamaParsedChat {
  explicit OllamaParsedChat(const json& extra = json::object(), const ChatTemplate& chat_template = ChatTemplate::chatml(),
                            bool generate = false) {
    json body = generate ? json{{"prompt", "hi"}} : json{{"messages", {ollama_user("hi")}}};
    body.update(extra);
    const OllamaGeneration g = generate ? generation_from_ollama_generate(body, {}) : generation_from_ollama_chat(body, {});
    parsed = RequestParser(tokenizer, chat_template, 4096).parse(g.endpoint, g.body, MaxTokens::kAtMost);
  }
  Tokenizer tokenizer = test_util::tiny_bpe_tokenizer();
  ParsedRequest parsed;
};

ChoiceEvent ollama_event(const std::string& text, int64_t tokens, const std::string& finish = "") {
  ChoiceEvent ev;
  ev.event.text = text;
  ev.event.completion_tokens = tokens;
  ev.event.prompt_tokens = 7;
  ev.event.finished = !finish.empty();
  ev.event.finish_reason = finish;
  return ev;
}

}  // namespace

TEST(OllamaResponse, StreamsChunksThenTheFinalObject) {
  const OllamaParsedChat request(
      {{"tools", {ollama_weather_tool()}}},
      ChatTemplate::parse("{% for m in messages %}{{ m.content }}{% endfor %}{% if false %}<think>{% endif %}"));
  const Clock::time_point arrival = Clock::now();
  OllamaEncoder encoder(request.parsed, OllamaShape::kChat, "tiny:latest", arrival);
  EXPECT_EQ(encoder.content_type(), "application/x-ndjson");
  std::string bytes = encoder.stream_start();
  for (const ChoiceEvent& ev : {ollama_event("<think>Hmm", 2), ollama_event(".</think>It is", 5),
                                ollama_event(" {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}", 20, "stop")})
    bytes += encoder.stream_event(ev);
  bytes += encoder.stream_end();
  const std::vector<json> lines = ndjson_lines(bytes);
  ASSERT_GE(lines.size(), 4u) << bytes;
  std::string thinking, content;
  json calls = json::array();
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["done"], false);
    EXPECT_EQ(lines[i]["model"], "tiny:latest");
    EXPECT_TRUE(lines[i]["created_at"].get<std::string>().ends_with("Z"));
    const json& message = lines[i]["message"];
    EXPECT_EQ(message["role"], "assistant");
    thinking += message.value("thinking", "");
    content += message["content"].get<std::string>();
    for (const json& call : message.value("tool_calls", json::array())) calls.push_back(call);
  }
  EXPECT_EQ(thinking, "Hmm.");
  EXPECT_EQ(content, "It is");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], json({{"city", "Rome"}}));  // an object, as Ollama sends it
  EXPECT_EQ(calls[0]["function"]["index"], 0);
  const json& last = lines.back();
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["done_reason"], "stop");
  EXPECT_EQ(last["message"]["content"], "");
  EXPECT_EQ(last["prompt_eval_count"], 7);
  EXPECT_EQ(last["eval_count"], 20);
  for (const char* duration : {"total_duration", "load_duration", "prompt_eval_duration", "eval_duration"})
    EXPECT_TRUE(last[duration].is_number_integer()) << duration;
  EXPECT_GE(last["total_duration"].get<int64_t>(), last["eval_duration"].get<int64_t>());
  // An idle stream's keep-alive is a chunk like the others, with no text.
  const json idle = json::parse(encoder.keep_alive());
  EXPECT_EQ(idle["done"], false);
  EXPECT_EQ(idle["message"]["content"], "");
}

TEST(OllamaResponse, WholeAnswersAndFailures) {
  const OllamaParsedChat chat;
  ChoiceResult r;
  r.add(ollama_event("Hel", 1).event);
  r.add(ollama_event("lo", 16, "length").event);
  const json out = OllamaEncoder(chat.parsed, OllamaShape::kChat, "tiny", Clock::now()).whole({r});
  EXPECT_EQ(out["message"], json({{"role", "assistant"}, {"content", "Hello"}}));
  EXPECT_EQ(out["done"], true);
  EXPECT_EQ(out["done_reason"], "length");
  EXPECT_EQ(out["eval_count"], 16);
  const OllamaParsedChat generate(json::object(), ChatTemplate::chatml(), true);
  const json answered = OllamaEncoder(generate.parsed, OllamaShape::kGenerate, "tiny", Clock::now()).whole({r});
  EXPECT_EQ(answered["response"], "Hello");
  EXPECT_FALSE(answered.contains("message"));
  OllamaEncoder streaming(generate.parsed, OllamaShape::kGenerate, "tiny", Clock::now());
  EXPECT_EQ(json::parse(streaming.stream_event(ollama_event("Hi", 1)))["response"], "Hi");
  // A generation that failed mid-stream ends with an {"error"} line and nothing after it.
  ChoiceEvent failed = ollama_event("", 1, "error");
  failed.event.error = "boom";
  const std::vector<json> lines = ndjson_lines(streaming.stream_event(failed));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0]["error"].get<std::string>().find("boom"), std::string::npos);
  EXPECT_EQ(streaming.stream_end(), "");
  const json loaded = ollama_load_answer(OllamaShape::kChat, "tiny", "unload");
  EXPECT_EQ(loaded["done_reason"], "unload");
  EXPECT_EQ(loaded["message"]["content"], "");
}

TEST(OllamaModels, NamesSizesAndQuantizationAsOllamaWritesThem) {
  EXPECT_EQ(ollama_parameter_size(134515008), "134.52M");
  EXPECT_EQ(ollama_parameter_size(8030261248), "8.0B");
  EXPECT_EQ(ollama_parameter_size(7000000000), "7B");
  EXPECT_EQ(ollama_parameter_size(260000), "260K");
  EXPECT_EQ(ollama_parameter_size(999), "999");
  EXPECT_EQ(ollama_quantization_level(3), "Q4_1");
  EXPECT_EQ(ollama_quantization_level(15), "Q4_K_M");
  EXPECT_EQ(ollama_quantization_level(32), "BF16");
  EXPECT_EQ(ollama_quantization_level(1000), "unknown");
}

namespace {

class OllamaServer : public test_util::SynthModelSuite {};

httplib::Result ollama_post(httplib::Client& c, const std::string& path, const json& body) {
  return c.Post(path.c_str(), {{"Authorization", "Bearer secret"}}, body.dump(), "application/json");
}

}  // namespace

TEST_F(OllamaServer, DescribesTheServedModel) {
  test_util::TestServer server(*synth_->model, *synth_->tokenizer, EngineOptions{}, {"secret"});
  httplib::Client c = server.client();
  const httplib::Headers key = {{"Authorization", "Bearer secret"}};
  auto refused = c.Get("/api/tags");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_TRUE(json::parse(refused->body)["error"].is_string());  // Ollama's error shape on /api/
  auto tags = c.Get("/api/tags", key);
  ASSERT_TRUE(tags);
  ASSERT_EQ(tags->status, 200) << tags->body;
  const json model = json::parse(tags->body)["models"][0];
  EXPECT_EQ(model["name"], "tiny:latest");
  EXPECT_EQ(model["size"], synth_->model->file().file_size());
  EXPECT_EQ(model["digest"].get<std::string>().size(), 64u);
  EXPECT_EQ(model["details"]["family"], "llama");
  EXPECT_EQ(model["details"]["format"], "gguf");
  auto show = ollama_post(c, "/api/show", {{"model", "tiny"}});
  ASSERT_TRUE(show);
  ASSERT_EQ(show->status, 200) << show->body;
  const json shown = json::parse(show->body);
  EXPECT_EQ(shown["model_info"]["general.architecture"], "llama");
  EXPECT_TRUE(shown["model_info"]["llama.context_length"].is_number_integer());
  EXPECT_NE(std::find(shown["capabilities"].begin(), shown["capabilities"].end(), "completion"), shown["capabilities"].end());
  auto ps = c.Get("/api/ps", key);
  ASSERT_TRUE(ps);
  const json loaded = json::parse(ps->body)["models"][0];
  EXPECT_EQ(loaded["name"], "tiny:latest");
  EXPECT_TRUE(loaded.contains("expires_at"));
  auto version = c.Get("/api/version", key);
  ASSERT_TRUE(version);
  EXPECT_EQ(json::parse(version->body)["version"], kOllamaApiVersion);
  auto other = ollama_post(c, "/api/show", {{"model", "llama3:8b"}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_EQ(json::parse(other->body)["error"], "model \"llama3:8b\" not found; this server serves \"tiny:latest\"");
  for (const char* path : {"/api/embed", "/api/embeddings"}) {
    auto embed = ollama_post(c, path, {{"model", "tiny"}, {"input", "hi"}});
    ASSERT_TRUE(embed);
    EXPECT_EQ(embed->status, 404);
    EXPECT_NE(json::parse(embed->body)["error"].get<std::string>().find("not implemented"), std::string::npos);
  }
}

TEST_F(OllamaServer, ChatsAndGeneratesStreamedAndWhole) {
  test_util::TestServer server(*synth_->model, *synth_->tokenizer, EngineOptions{}, {"secret"});
  httplib::Client c = server.client();
  const json chat = {{"model", "tiny:latest"}, {"messages", {ollama_user("hi")}},
                     {"options", {{"num_predict", 5}, {"temperature", 0}}}};
  auto streamed = ollama_post(c, "/api/chat", chat);
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "application/x-ndjson");
  const std::vector<json> lines = ndjson_lines(streamed->body);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines.back()["done"], true);
  EXPECT_EQ(lines.back()["eval_count"], 5);
  EXPECT_EQ(lines.back()["done_reason"], "length");
  json whole_chat = chat;
  whole_chat["stream"] = false;
  auto whole = ollama_post(c, "/api/chat", whole_chat);
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json answer = json::parse(whole->body);
  std::string streamed_text;
  for (const json& line : lines) streamed_text += line["message"]["content"].get<std::string>();
  EXPECT_EQ(answer["message"]["content"], streamed_text);  // greedy: the same text either way
  EXPECT_EQ(answer["model"], "tiny:latest");
  // Greedy: a sampled token could be the end of text before the third (the random model's EOS is as likely as any).
  auto generated = ollama_post(c, "/api/generate", {{"prompt", "Once"}, {"raw", true}, {"stream", false},
                                                    {"options", {{"num_predict", 3}, {"temperature", 0}}}});
  ASSERT_TRUE(generated);
  ASSERT_EQ(generated->status, 200) << generated->body;
  EXPECT_EQ(json::parse(generated->body)["eval_count"], 3);
  EXPECT_EQ(json::parse(generated->body)["model"], "tiny:latest");  // no model named: the served one
  auto load = ollama_post(c, "/api/generate", {{"model", "tiny"}});
  ASSERT_TRUE(load);
  EXPECT_EQ(json::parse(load->body)["done_reason"], "load");
}

TEST_F(OllamaServer, RefusesBadRequestsInOllamasShape) {
  test_util::TestServer server(*synth_->model, *synth_->tokenizer, EngineOptions{}, {"secret"});
  httplib::Client c = server.client();
  const std::vector<std::pair<std::string, std::string>> bodies = {
      {"/api/chat", "{"},
      {"/api/chat", "[1, 2]"},
      {"/api/chat", R"({"messages": [{"role": "user", "content": "hi"}], "options": {"temperature": 99}})"},
      {"/api/chat", R"({"messages": [{"role": "user", "content": "hi"}], "options": {"top_p": -1}})"},
      {"/api/chat", R"({"messages": [{"role": "user", "content": "hi"}], "options": {"stop": [1]}})"},
      {"/api/chat", R"({"messages": [{"role": "user", "content": "hi"}], "think": true})"},
      {"/api/chat", R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"function": {"name": "a b"}}]})"},
      {"/api/chat", R"({"messages": [{"role": "user", "content": "hi"}], "format": {"type": "nope"}})"},
      {"/api/generate", R"({"prompt": "x", "options": {"num_predict": 18446744073709551615}})"},
      {"/api/generate", R"({"prompt": "x", "options": {"repeat_last_n": -7}})"},
      {"/api/generate", std::string(70, '[') + std::string(70, ']')},
      {"/api/show", R"({"model": 5})"},
  };
  for (const auto& [path, body] : bodies) {
    auto r = c.Post(path.c_str(), {{"Authorization", "Bearer secret"}}, body, "application/json");
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, 400) << path << " " << body << ": " << r->body;
    const json error = json::parse(r->body);
    EXPECT_TRUE(error["error"].is_string()) << r->body;
    EXPECT_EQ(error.size(), 1u) << r->body;
  }
  auto unknown = ollama_post(c, "/api/chat", {{"model", "mistral"}, {"messages", {ollama_user("hi")}}});
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  auto images = ollama_post(c, "/api/generate", {{"prompt", "what is this?"}, {"images", {"iVBORw0KGgo="}}});
  ASSERT_TRUE(images);
  EXPECT_EQ(images->status, 400);
  EXPECT_NE(json::parse(images->body)["error"].get<std::string>().find("images"), std::string::npos);
}

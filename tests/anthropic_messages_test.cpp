// Anthropic's Messages API: requests translated onto the chat path, the
// answer's message and SSE event sequence (thinking, text and tool_use
// blocks), its error shapes, and the endpoints through the server.
#include <gtest/gtest.h>

#include <httplib.h>
#include <signal.h>

#include "server/anthropic_encoder.h"
#include "server/anthropic_messages.h"
#include "server/request_parser.h"
#include "server_harness.h"
#include "tiny_vocab.h"

using namespace kvserve;
using namespace kvserve::server;
using json = nlohmann::json;

namespace {

ApiError translation_error(const json& body) {
  return test_util::api_error_of([&] { chat_body_from_messages(body); });
}

json weather_tool() {
  return {{"name", "get_weather"},
          {"description", "Get the weather"},
          {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};
}

}  // namespace

TEST(MessagesRequest, BecomesTheChatBodyItStandsFor) {
  const json body = {
      {"model", "tiny"},
      {"max_tokens", 32},
      {"system", json::array({{{"type", "text"}, {"text", "Be brief."}}})},
      {"stop_sequences", {"END"}},
      {"temperature", 0.5},
      {"top_k", 5},
      {"stream", true},
      {"tools", {weather_tool()}},
      {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
      {"thinking", {{"type", "disabled"}}},
      {"messages",
       {{{"role", "user"}, {"content", "Weather in Paris?"}},
        {{"role", "assistant"},
         {"content",
          {{{"type", "thinking"}, {"thinking", "Need the tool."}, {"signature", "x"}},
           {{"type", "text"}, {"text", "Checking."}},
           {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}}}}},
        {{"role", "user"},
         {"content",
          {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", {{{"type", "text"}, {"text", "18 C"}}}}},
           {{"type", "text"}, {"text", "Thanks"}}}}}}}};
  const json chat = chat_body_from_messages(body);
  const json expected_messages = {
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "user"}, {"content", "Weather in Paris?"}},
      {{"role", "assistant"},
       {"content", "Checking."},
       {"reasoning_content", "Need the tool."},
       {"tool_calls",
        {{{"id", "toolu_1"}, {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Paris"})"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "18 C"}},
      {{"role", "user"}, {"content", "Thanks"}}};
  EXPECT_EQ(chat["messages"], expected_messages);
  EXPECT_EQ(chat["max_tokens"], 32);
  EXPECT_EQ(chat["stop"], json({"END"}));
  EXPECT_EQ(chat["temperature"], 0.5);
  EXPECT_EQ(chat["top_k"], 5);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_EQ(chat["tool_choice"], "required");
  EXPECT_EQ(chat["parallel_tool_calls"], false);
  EXPECT_EQ(chat["tools"][0]["function"]["parameters"], weather_tool()["input_schema"]);
  EXPECT_EQ(chat["chat_template_kwargs"]["enable_thinking"], false);
  // A named tool; a result that failed says so.
  const json named = chat_body_from_messages(
      {{"max_tokens", 8},
       {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}},
       {"messages",
        {{{"role", "user"},
          {"content", {{{"type", "tool_result"}, {"tool_use_id", "t"}, {"content", "boom"}, {"is_error", true}}}}}}}});
  EXPECT_EQ(named["tool_choice"]["function"]["name"], "get_weather");
  EXPECT_EQ(named["messages"], json({{{"role", "tool"}, {"tool_call_id", "t"}, {"content", "Error: boom"}}}));
}

TEST(MessagesRequest, BadRequestsNameTheMessagesField) {
  const json user = {{"role", "user"}, {"content", "hi"}};
  EXPECT_EQ(translation_error({{"messages", {user}}}).param(), "max_tokens");
  EXPECT_EQ(translation_error({{"max_tokens", 0}, {"messages", {user}}}).param(), "max_tokens");
  EXPECT_EQ(translation_error({{"max_tokens", 8}, {"messages", json::array()}}).param(), "messages");
  EXPECT_EQ(translation_error({{"max_tokens", 8}, {"messages", {{{"role", "system"}, {"content", "x"}}}}}).param(),
            "messages[0].role");
  const json image = {{"role", "user"}, {"content", {{{"type", "image"}, {"source", json::object()}}}}};
  EXPECT_EQ(translation_error({{"max_tokens", 8}, {"messages", {image}}}).param(), "messages[0].content[0].type");
  const json user_tool_use = {{"role", "user"},
                              {"content", {{{"type", "tool_use"}, {"id", "a"}, {"name", "f"}, {"input", 1}}}}};
  EXPECT_EQ(translation_error({{"max_tokens", 8}, {"messages", {user_tool_use}}}).param(), "messages[0].content[0].type");
  const json server_tool = {{"type", "web_search_20250305"}, {"name", "web_search"}};
  EXPECT_EQ(translation_error({{"max_tokens", 8}, {"messages", {user}}, {"tools", {server_tool}}}).param(), "tools[0].type");
  EXPECT_EQ(translation_error({{"max_tokens", 8}, {"messages", {user}}, {"tool_choice", "auto"}}).param(), "tool_choice");
  EXPECT_EQ(translation_error({{"max_tokens", 8}, {"messages", {user}}, {"thinking", {{"type", "x"}}}}).param(),
            "thinking.type");
  EXPECT_EQ(translation_error({{"max_tokens", 8}, {"messages", {user}}, {"system", 3}}).param(), "system");
  // The chat parser's names, as Messages names them.
  EXPECT_EQ(as_messages_error(invalid("stop", "x")).param(), "stop_sequences");
  EXPECT_EQ(as_messages_error(invalid("tools[2].function.parameters", "x")).param(), "tools[2].input_schema");
  EXPECT_EQ(messages_error_body(invalid("x", "bad")),
            json({{"type", "error"}, {"error", {{"type", "invalid_request_error"}, {"message", "bad"}}}}));
  EXPECT_EQ(messages_error_body(ApiError(401, "k"))["error"]["type"], "authentication_error");
  EXPECT_EQ(messages_error_body(ApiError(503, "busy"))["error"]["type"], "overloaded_error");
}

namespace {

// The encoder of a Messages request parsed through the chat path.
struct MessagesRequest {
  explicit MessagesRequest(const json& extra = json::object(), const ChatTemplate& chat_template = ChatTemplate::chatml()) {
    json body = {{"max_tokens", 16}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
    body.update(extra);
    parsed = RequestParser(tokenizer, chat_template, 4096).parse(Endpoint::kChat, chat_body_from_messages(body));
  }
  Tokenizer tokenizer = test_util::tiny_bpe_tokenizer();
  ParsedRequest parsed;
};

ChoiceEvent event(const std::string& text, int64_t tokens, const std::string& finish = "", const std::string& stop = "") {
  ChoiceEvent ev;
  ev.event.text = text;
  ev.event.completion_tokens = tokens;
  ev.event.prompt_tokens = 7;
  ev.event.finished = !finish.empty();
  ev.event.finish_reason = finish;
  ev.event.stop_sequence = stop;
  return ev;
}

}  // namespace

TEST(MessagesResponse, StreamsTheEventSequence) {
  const MessagesRequest request({{"tools", {weather_tool()}}},
                                ChatTemplate::parse("{% for m in messages %}{{ m.content }}{% endfor %}{% if false %}<think>{% endif %}"));
  AnthropicEncoder encoder(request.parsed, "tiny");
  std::string bytes = encoder.stream_start();
  for (const ChoiceEvent& ev : {event("<think>Hmm", 2), event(".</think>It is", 5),
                                event(" {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}", 20, "stop")})
    bytes += encoder.stream_event(ev);
  bytes += encoder.stream_end();
  std::vector<std::string> names;
  std::vector<json> data;
  for (const test_util::SseEvent& ev : test_util::sse_events(bytes)) {
    names.push_back(ev.event);
    data.push_back(json::parse(ev.data));
    EXPECT_EQ(data.back()["type"], ev.event);  // every event's data names its type
  }
  const std::vector<std::string> expected = {
      "message_start", "ping",
      "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",  // thinking
      "content_block_start", "content_block_delta", "content_block_stop",                        // text
      "content_block_start", "content_block_delta", "content_block_stop",                        // tool_use
      "message_delta", "message_stop"};
  ASSERT_EQ(names, expected) << bytes;
  EXPECT_EQ(data[0]["message"]["usage"]["input_tokens"], request.parsed.requests[0].request().prompt.size());
  EXPECT_EQ(data[2]["content_block"]["type"], "thinking");
  EXPECT_EQ(data[3]["delta"], json({{"type", "thinking_delta"}, {"thinking", "Hmm"}}));
  EXPECT_EQ(data[4]["delta"]["thinking"], ".");
  EXPECT_EQ(data[6]["index"], 1);
  EXPECT_EQ(data[7]["delta"], json({{"type", "text_delta"}, {"text", "It is"}}));
  EXPECT_EQ(data[9]["index"], 2);
  EXPECT_EQ(data[9]["content_block"]["type"], "tool_use");
  EXPECT_EQ(data[9]["content_block"]["name"], "get_weather");
  EXPECT_EQ(data[9]["content_block"]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(data[10]["delta"], json({{"type", "input_json_delta"}, {"partial_json", R"({"city":"Rome"})"}}));
  EXPECT_EQ(data[12]["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(data[12]["usage"]["output_tokens"], 20);
}

TEST(MessagesResponse, WholeMessageAndStopReasons) {
  const MessagesRequest request;
  AnthropicEncoder encoder(request.parsed, "tiny");
  ChoiceResult r;
  r.add(event("Hello", 3, "stop", "END").event);
  const json out = encoder.whole({r});
  EXPECT_EQ(out["type"], "message");
  EXPECT_EQ(out["role"], "assistant");
  EXPECT_EQ(out["content"], json({{{"type", "text"}, {"text", "Hello"}}}));
  EXPECT_EQ(out["stop_reason"], "stop_sequence");
  EXPECT_EQ(out["stop_sequence"], "END");
  EXPECT_EQ(out["usage"]["input_tokens"], 7);
  EXPECT_EQ(out["usage"]["output_tokens"], 3);
  ChoiceResult cut;
  cut.add(event("Hel", 16, "length").event);
  EXPECT_EQ(AnthropicEncoder(request.parsed, "tiny").whole({cut})["stop_reason"], "max_tokens");
  ChoiceResult eos;
  eos.add(event("Hi", 2, "stop").event);
  const json ended = AnthropicEncoder(request.parsed, "tiny").whole({eos});
  EXPECT_EQ(ended["stop_reason"], "end_turn");
  EXPECT_TRUE(ended["stop_sequence"].is_null());
  // A generation that failed mid-stream ends with an error event and nothing after it.
  AnthropicEncoder failing(request.parsed, "tiny");
  ChoiceEvent failed = event("", 1, "error");
  failed.event.error = "boom";
  const std::vector<test_util::SseEvent> events = test_util::sse_events(failing.stream_event(failed));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].event, "error");
  EXPECT_EQ(json::parse(events[0].data)["error"]["message"], "boom");
  EXPECT_EQ(failing.stream_end(), "");
}

namespace {

class MessagesServer : public test_util::SynthModelSuite {
};

}  // namespace

TEST_F(MessagesServer, AnswersInAnthropicsShapesWithItsKeyHeader) {
  test_util::TestServer server(*synth_->model, *synth_->tokenizer, EngineOptions{}, {"secret"});
  httplib::Client c = server.client();
  const json body = {{"model", "tiny"}, {"max_tokens", 4}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto refused = c.Post("/v1/messages", body.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(json::parse(refused->body)["error"]["type"], "authentication_error");
  const httplib::Headers key = {{"x-api-key", "secret"}, {"anthropic-version", "2023-06-01"}};
  auto out = c.Post("/v1/messages", key, body.dump(), "application/json");
  ASSERT_TRUE(out);
  ASSERT_EQ(out->status, 200) << out->body;
  const json message = json::parse(out->body);
  EXPECT_EQ(message["usage"]["output_tokens"], 4);
  EXPECT_EQ(message["stop_reason"], "max_tokens");
  auto counted = c.Post("/v1/messages/count_tokens", key, json{{"messages", body["messages"]}}.dump(), "application/json");
  ASSERT_TRUE(counted);
  ASSERT_EQ(counted->status, 200) << counted->body;
  EXPECT_EQ(json::parse(counted->body)["input_tokens"], message["usage"]["input_tokens"]);
  // A bad request: 400 in Anthropic's shape, the field named in the message.
  json bad = body;
  bad["stop_sequences"] = "END";
  auto refused_stop = c.Post("/v1/messages", key, bad.dump(), "application/json");
  ASSERT_TRUE(refused_stop);
  EXPECT_EQ(refused_stop->status, 400);
  const json error = json::parse(refused_stop->body);
  EXPECT_EQ(error["type"], "error");
  EXPECT_EQ(error["error"]["type"], "invalid_request_error");
  auto not_json = c.Post("/v1/messages", key, "{", "application/json");
  ASSERT_TRUE(not_json);
  EXPECT_EQ(not_json->status, 400);
  EXPECT_EQ(json::parse(not_json->body)["type"], "error");
}

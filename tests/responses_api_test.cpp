// OpenAI's Responses API: requests translated onto the chat path, the
// response object and its typed SSE events, the bounded store, and the
// endpoints through the server.
#include <gtest/gtest.h>

#include <httplib.h>
#include <signal.h>

#include "server/request_parser.h"
#include "server/response_store.h"
#include "server/responses_encoder.h"
#include "server/responses_request.h"
#include "server_harness.h"
#include "tiny_vocab.h"

using namespace kvserve;
using namespace kvserve::server;
using json = nlohmann::json;

namespace {

ApiError translation_error(const json& body) {
  return test_util::api_error_of([&] { chat_body_from_responses(body, json::array()); });
}

json weather_tool() {
  return {{"type", "function"},
          {"name", "get_weather"},
          {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};
}

}  // namespace

TEST(ResponsesRequest, BecomesTheChatBodyItStandsFor) {
  const json history = json::array({{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Hello"}}});
  const json body = {
      {"model", "tiny"},
      {"instructions", "Be brief."},
      {"max_output_tokens", 32},
      {"temperature", 0.2},
      {"tools", {weather_tool()}},
      {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
      {"reasoning", {{"effort", "low"}}},
      {"text", {{"format", {{"type", "json_schema"}, {"name", "w"}, {"schema", {{"type", "object"}}}, {"strict", true}}}}},
      {"input",
       {{{"role", "developer"}, {"content", "Use tools."}},
        {{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Weather?"}}}}},
        {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", json::array()},
         {"content", {{{"type", "reasoning_text"}, {"text", "Call it."}}}}},
        {{"type", "function_call"}, {"call_id", "call_1"}, {"name", "get_weather"}, {"arguments", R"({"city":"Rome"})"}},
        {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "18 C"}}}}};
  const json chat = chat_body_from_responses(body, history);
  const json expected = {
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "user"}, {"content", "Hi"}},
      {{"role", "assistant"}, {"content", "Hello"}},
      {{"role", "system"}, {"content", "Use tools."}},
      {{"role", "user"}, {"content", "Weather?"}},
      {{"role", "assistant"},
       {"content", ""},
       {"reasoning_content", "Call it."},
       {"tool_calls",
        {{{"id", "call_1"}, {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Rome"})"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C"}}};
  EXPECT_EQ(chat["messages"], expected);
  EXPECT_EQ(chat["max_tokens"], 32);
  EXPECT_EQ(chat["temperature"], 0.2);
  EXPECT_EQ(chat["tool_choice"]["function"]["name"], "get_weather");
  EXPECT_EQ(chat["tools"][0]["function"]["parameters"], weather_tool()["parameters"]);
  EXPECT_EQ(chat["reasoning_effort"], "low");
  EXPECT_EQ(chat["response_format"]["type"], "json_schema");
  EXPECT_EQ(chat["response_format"]["json_schema"]["schema"], json({{"type", "object"}}));
  // The store keeps the input without the instructions (a later response does not inherit them).
  EXPECT_EQ(responses_input_messages(body).size(), 4u);
  EXPECT_EQ(chat_body_from_responses({{"input", "Hey"}}, json::array())["messages"],
            json({{{"role", "user"}, {"content", "Hey"}}}));
}

TEST(ResponsesRequest, BadRequestsNameTheResponsesField) {
  EXPECT_EQ(translation_error(json::object()).param(), "input");
  EXPECT_EQ(translation_error({{"input", json::array()}}).param(), "input");
  EXPECT_EQ(translation_error({{"input", {{{"type", "input_image"}}}}}).param(), "input[0].type");
  EXPECT_EQ(translation_error({{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}}).param(),
            "input[0].content[0].type");
  EXPECT_EQ(translation_error({{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}).param(), "tools[0].type");
  EXPECT_EQ(translation_error({{"input", "x"}, {"text", {{"format", {{"type", "xml"}}}}}}).param(), "text.format.type");
  EXPECT_EQ(translation_error({{"input", {{{"type", "function_call_output"}, {"call_id", "c"}}}}}).param(),
            "input[0].output");
  EXPECT_EQ(as_responses_error(invalid("max_tokens", "x")).param(), "max_output_tokens");
  EXPECT_EQ(as_responses_error(invalid("response_format.json_schema.schema", "x")).param(), "text.format");
  EXPECT_EQ(as_responses_error(invalid("tools[1].function.parameters", "x")).param(), "tools[1].parameters");
}

TEST(ResponseStore, KeepsTheNewestWithinItsBounds) {
  ResponseStore store(2, 1 << 20);
  for (const char* id : {"a", "b", "c"}) store.put(id, {{{"id", id}}, json::array()});
  EXPECT_FALSE(store.get("a").has_value());  // the oldest went first
  EXPECT_EQ(store.get("c")->response["id"], "c");
  EXPECT_EQ(store.size(), 2u);
  EXPECT_TRUE(store.erase("b"));
  EXPECT_FALSE(store.erase("b"));
  ResponseStore small(100, 200);
  small.put("big", {{{"text", std::string(500, 'x')}}, json::array()});  // larger than the whole store: not kept
  EXPECT_FALSE(small.get("big").has_value());
  for (int i = 0; i < 10; ++i) small.put("r" + std::to_string(i), {{{"text", std::string(40, 'y')}}, json::array()});
  EXPECT_LE(small.bytes(), 200u);
  EXPECT_TRUE(small.get("r9").has_value());
  EXPECT_FALSE(small.get("r0").has_value());
}

namespace {

ChoiceEvent event(const std::string& text, int64_t tokens, const std::string& finish = "") {
  ChoiceEvent ev;
  ev.event.text = text;
  ev.event.completion_tokens = tokens;
  ev.event.prompt_tokens = 9;
  ev.event.finished = !finish.empty();
  ev.event.finish_reason = finish;
  return ev;
}

}  // namespace

TEST(ResponsesEncoderTest, StreamsTypedEventsAndStoresTheAnswer) {
  const Tokenizer tokenizer = test_util::tiny_bpe_tokenizer();
  const ChatTemplate reasons = ChatTemplate::parse("{% for m in messages %}{{ m.content }}{% endfor %}{% if false %}<think>{% endif %}");
  const ParsedRequest parsed = RequestParser(tokenizer, reasons, 4096).parse(
      Endpoint::kChat, chat_body_from_responses({{"input", "hi"}, {"tools", {weather_tool()}}}, json::array()));
  json stored_response, stored_answer;
  ResponsesEncoder encoder(parsed, tokenizer, "tiny", responses_settings({{"input", "hi"}}),
                           [&](const json& response, const json& answer) {
                             stored_response = response;
                             stored_answer = answer;
                           });
  std::string bytes = encoder.stream_start();
  for (const ChoiceEvent& ev : {event("<think>Hmm.</think>", 3), event("Sure.", 5),
                                event(" {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}", 20, "stop")})
    bytes += encoder.stream_event(ev);
  bytes += encoder.stream_end();
  std::vector<std::string> names;
  std::vector<json> data;
  for (const test_util::SseEvent& ev : test_util::sse_events(bytes)) {
    names.push_back(ev.event);
    data.push_back(json::parse(ev.data));
    EXPECT_EQ(data.back()["type"], ev.event);
    EXPECT_EQ(data.back()["sequence_number"], data.size() - 1);
  }
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.done",
      "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.completed"};
  ASSERT_EQ(names, expected) << bytes;
  EXPECT_EQ(data[0]["response"]["status"], "in_progress");
  EXPECT_EQ(data[3]["delta"], "Hmm.");
  EXPECT_EQ(data[8]["delta"], "Sure.");
  EXPECT_EQ(data[8]["output_index"], 1);
  EXPECT_EQ(data[13]["delta"], R"({"city":"Oslo"})");
  EXPECT_EQ(data[15]["item"]["call_id"].get<std::string>().rfind("call_", 0), 0u);
  const json& done = data.back()["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][0]["type"], "reasoning");
  EXPECT_EQ(done["output"][1]["content"][0]["text"], "Sure.");
  EXPECT_EQ(done["output"][2]["type"], "function_call");
  EXPECT_EQ(done["output"][1]["id"], data[6]["item"]["id"]);  // the same item ids as the events gave
  EXPECT_EQ(done["usage"]["output_tokens"], 20);
  EXPECT_EQ(done["tool_choice"], "auto");
  EXPECT_EQ(stored_response, done);
  EXPECT_EQ(stored_answer["content"], "Sure.");
  EXPECT_EQ(stored_answer["reasoning_content"], "Hmm.");
  EXPECT_EQ(stored_answer["tool_calls"][0]["function"]["name"], "get_weather");
}

namespace {

class ResponsesServer : public test_util::SynthModelSuite {
};

}  // namespace

TEST_F(ResponsesServer, ContinuesStoredResponsesAndForgetsDeletedOnes) {
  test_util::TestServer server(*synth_->model, *synth_->tokenizer);
  httplib::Client c = server.client();
  auto first = c.Post("/v1/responses", json{{"input", "hi"}, {"max_output_tokens", 3}}.dump(), "application/json");
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  const json r1 = json::parse(first->body);
  EXPECT_EQ(r1["status"], "incomplete");
  EXPECT_EQ(r1["incomplete_details"]["reason"], "max_output_tokens");
  const std::string id = r1["id"];
  auto second = c.Post("/v1/responses", json{{"input", "more"}, {"previous_response_id", id}, {"max_output_tokens", 2}}.dump(),
                       "application/json");
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 200) << second->body;
  EXPECT_GT(json::parse(second->body)["usage"]["input_tokens"].get<int64_t>(),
            r1["usage"]["input_tokens"].get<int64_t>() + 3);
  auto got = c.Get(("/v1/responses/" + id).c_str());
  ASSERT_TRUE(got);
  EXPECT_EQ(json::parse(got->body), r1);
  auto deleted = c.Delete(("/v1/responses/" + id).c_str());
  ASSERT_TRUE(deleted);
  EXPECT_EQ(deleted->status, 200);
  auto gone = c.Post("/v1/responses", json{{"input", "x"}, {"previous_response_id", id}}.dump(), "application/json");
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->status, 400);
  EXPECT_EQ(json::parse(gone->body)["error"]["param"], "previous_response_id");
  auto missing = c.Get("/v1/responses/resp_nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  auto bad = c.Post("/v1/responses", json{{"input", "x"}, {"max_output_tokens", -1}}.dump(), "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "max_output_tokens");
}

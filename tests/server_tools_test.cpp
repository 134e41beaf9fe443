// Tool calling in the server: tool conversations rendered through chat
// templates (the real Qwen2.5 and SmolLM2 ones when the models are in
// models/), request validation, and the tool_calls response and stream
// shapes (a random model does not write calls: the formatter is fed text).
#include <gtest/gtest.h>

#include <filesystem>
#include <httplib.h>
#include <signal.h>

#include "model/gguf.h"
#include "server/api_error.h"
#include "server/request_parser.h"
#include "server/response_format.h"
#include "server/tool_conversation.h"
#include "server_harness.h"
#include "test_util.h"
#include "tiny_vocab.h"
#include "tokenizer/chat_template.h"

using namespace kvserve;
using namespace kvserve::server;
using json = nlohmann::json;

namespace {

// Keys in sorted order, so that Hugging Face's rendering (insertion order)
// and this one (sorted) print them alike.
json weather_tool() {
  return {{"function",
           {{"description", "Get the weather in a city"},
            {"name", "get_weather"},
            {"parameters", {{"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}, {"type", "object"}}}}},
          {"type", "function"}};
}

json tool_call(const std::string& id, const std::string& name, const std::string& arguments) {
  return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
}

// A weather question answered by two calls and their results.
json weather_conversation() {
  return json::array({{{"role", "system"}, {"content", "You are terse."}},
                      {{"role", "user"}, {"content", "Weather in Paris and Rome?"}},
                      {{"role", "assistant"},
                       {"content", nullptr},
                       {"tool_calls", {tool_call("call_1", "get_weather", R"({"city": "Paris"})"),
                                       tool_call("call_2", "get_weather", R"({"city": "Rome"})")}}},
                      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C"}},
                      {{"role", "tool"}, {"tool_call_id", "call_2"}, {"content", "24 C"}}});
}

std::string model_path(const std::string& file) {
  const std::string p = test_util::model_dir() + "/" + file;
  return std::filesystem::exists(p) ? p : "";
}

class ToolConversation : public ::testing::Test {
 protected:
  // The prompt text of a chat body under `chat_template`.
  std::string prompt_of(const ChatTemplate& chat_template, const json& body) const {
    const RequestParser parser(tokenizer_, chat_template, 1 << 20);
    const std::optional<ToolRequest> tools = parse_tool_request(body);
    std::string text;
    parser.chat_prompt(body["messages"], &text, tools ? &*tools : nullptr);
    return text;
  }
  // The param of the 400 that parse() answers.
  std::string error_param(const json& body, Endpoint endpoint = Endpoint::kChat) const {
    const ChatTemplate chatml = ChatTemplate::chatml();
    const RequestParser parser(tokenizer_, chatml, 4096);
    try {
      parser.parse(endpoint, body);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      return e.param();
    }
    return "(no error)";
  }

  Tokenizer tokenizer_ = test_util::tiny_bpe_tokenizer();
};

}  // namespace

// Rendered by transformers' jinja settings (tools/calls as given, arguments parsed) for
// the 0.5B's template; the 1.5B's writes its format line with doubled braces.
TEST_F(ToolConversation, QwenTemplateRendersToolsCallsAndResultsAsHuggingFaceDoes) {
  const std::string expected =
      "<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
      "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"function\": "
      "{\"description\": \"Get the weather in a city\", \"name\": \"get_weather\", \"parameters\": {\"properties\": "
      "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"], \"type\": \"object\"}}, \"type\": \"function\"}\n"
      "</tools>\n\nFor each function call, return a json object with function name and arguments within "
      "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
      "\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n<|im_start|>assistant\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n"
      "<tool_response>\n18 C\n</tool_response>\n<tool_response>\n24 C\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n";
  bool any = false;
  for (const std::string file : {"qwen2.5-coder-0.5b-instruct.gguf", "qwen2.5-coder-1.5b-instruct.gguf"}) {
    const std::string path = model_path(file);
    if (path.empty()) continue;
    any = true;
    const GGUFFile gguf(path);
    const ChatTemplate t = ChatTemplate::for_model(gguf);
    EXPECT_EQ(tool_call_format_for(t.source()), ToolCallFormat::kHermes);
    std::string want = expected;
    if (file.find("1.5b") != std::string::npos) {
      const std::string line = "{\"name\": <function-name>, \"arguments\": <args-json-object>}";
      want.replace(want.find(line), line.size(), "{" + line + "}");
    }
    const json body = {{"messages", weather_conversation()}, {"tools", {weather_tool()}}};
    EXPECT_EQ(prompt_of(t, body), want) << file;

    // tool_choice "none": the tools are not offered, the past calls still render.
    json none = body;
    none["tool_choice"] = "none";
    const std::string without = prompt_of(t, none);
    EXPECT_EQ(without.rfind("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user", 0), 0u) << without;
    EXPECT_NE(without.find("<tool_response>\n18 C"), std::string::npos);
  }
  if (!any) GTEST_SKIP() << "no Qwen2.5 model in models/";
}

TEST_F(ToolConversation, ToollessTemplateGetsTheToolsInItsSystemMessage) {
  const std::string tools_text =
      "You can call these functions (tools), given as JSON schemas:\n" + weather_tool().dump() +
      "\n\nTo call a function, answer with only a JSON object of this form: {\"name\": <function name>, \"arguments\": "
      "<its arguments as a JSON object>}\nTo call several functions, write one such object per line.\n";
  const std::string calls =
      "{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Rome\"}}";
  const std::string rest = "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n<|im_start|>assistant\n" + calls +
                           "<|im_end|>\n<|im_start|>tool\n18 C<|im_end|>\n<|im_start|>tool\n24 C<|im_end|>\n"
                           "<|im_start|>assistant\n";
  const json body = {{"messages", weather_conversation()}, {"tools", {weather_tool()}}};
  const ChatTemplate chatml = ChatTemplate::chatml();
  EXPECT_EQ(prompt_of(chatml, body), "<|im_start|>system\nYou are terse.\n\n" + tools_text +
                                         "If no function is needed, answer in plain text.<|im_end|>\n" + rest);

  // No system message: one is made; "required" and a named tool say so.
  json required = body;
  required["messages"].erase(0);
  required["tool_choice"] = "required";
  EXPECT_EQ(prompt_of(chatml, required),
            "<|im_start|>system\n" + tools_text + "You must call a function.<|im_end|>\n" + rest);
  json named = required;
  named["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  named["parallel_tool_calls"] = false;
  EXPECT_NE(prompt_of(chatml, named).find("object>}\nYou must call the function get_weather.<|im_end|>"), std::string::npos);

  // The real SmolLM2 template (no tools of its own) takes the same messages.
  const std::string smol = model_path("smollm2-135m-instruct-q4_1.gguf");
  if (smol.empty()) GTEST_SKIP() << "the default model has not been fetched";
  const GGUFFile gguf(smol);
  const ChatTemplate t = ChatTemplate::for_model(gguf);
  EXPECT_FALSE(template_knows_tools(t.source()));
  EXPECT_EQ(tool_call_format_for(t.source()), ToolCallFormat::kGenericJson);
  EXPECT_EQ(prompt_of(t, body), "<|im_start|>system\nYou are terse.\n\n" + tools_text +
                                    "If no function is needed, answer in plain text.<|im_end|>\n" + rest);
}

TEST_F(ToolConversation, ToolResultsBecomeUserMessagesWhereTheTemplateRefusesTheRole) {
  const ChatTemplate strict = ChatTemplate::parse(
      "{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
      "{{ raise_exception('unknown role ' + m.role) }}{% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}");
  json messages = weather_conversation();
  messages.erase(0);
  messages[2]["name"] = "weather";  // a name given with the result wins over the call's
  messages.push_back({{"role", "user"}, {"content", "Thanks"}});
  EXPECT_EQ(prompt_of(strict, {{"messages", messages}}),
            "[user]Weather in Paris and Rome?[assistant]{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n"
            "{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Rome\"}}[user]Tool result (weather): 18 C\n\n"
            "Tool result (get_weather): 24 C[user]Thanks");
  // A template that raises for other reasons still answers 400.
  const ChatTemplate raising = ChatTemplate::parse("{{ raise_exception('roles must alternate') }}");
  try {
    prompt_of(raising, {{"messages", messages}});
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "messages");
    EXPECT_NE(std::string(e.what()).find("roles must alternate"), std::string::npos);
  }
}

TEST_F(ToolConversation, BadToolMessagesAndToolsGet400NamingTheField) {
  auto with = [](json message) {
    return json{{"messages", {{{"role", "user"}, {"content", "hi"}}, std::move(message)}}};
  };
  auto assistant_calls = [&](json calls) { return with({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}}); };
  const json good_call = tool_call("c1", "get_weather", "{}");
  json no_name = good_call, bad_args = good_call, object_args = good_call, bad_type = good_call, bad_id = good_call,
       deep_args = good_call;
  deep_args["function"]["arguments"] = std::string(100000, '[') + std::string(100000, ']');
  no_name["function"].erase("name");
  bad_args["function"]["arguments"] = "{\"city\": ";
  object_args["function"]["arguments"] = {{"city", "Paris"}};
  bad_type["type"] = "code";
  bad_id["id"] = 7;
  const std::vector<std::pair<json, std::string>> cases = {
      {with({{"role", "tool"}, {"tool_call_id", "c1"}}), "messages[1].content"},
      {with({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", nullptr}}), "messages[1].content"},
      {with({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", 5}}), "messages[1].content"},
      {with({{"role", "tool"}, {"content", "18 C"}}), "messages[1].tool_call_id"},
      {with({{"role", "tool"}, {"content", "18 C"}, {"tool_call_id", 1}}), "messages[1].tool_call_id"},
      {assistant_calls("get_weather"), "messages[1].tool_calls"},
      {assistant_calls({5}), "messages[1].tool_calls[0]"},
      {assistant_calls({good_call, no_name}), "messages[1].tool_calls[1].function.name"},
      {assistant_calls(json::array({bad_args})), "messages[1].tool_calls[0].function.arguments"},
      {assistant_calls(json::array({object_args})), "messages[1].tool_calls[0].function.arguments"},
      {assistant_calls(json::array({deep_args})), "messages[1].tool_calls[0].function.arguments"},
      {assistant_calls(json::array({bad_type})), "messages[1].tool_calls[0].type"},
      {assistant_calls(json::array({bad_id})), "messages[1].tool_calls[0].id"},
      {assistant_calls({{{"type", "function"}}}), "messages[1].tool_calls[0].function"},
      {{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", {{{"type", "function"}}}}}, "tools[0].function"},
  };
  for (const auto& [body, param] : cases) EXPECT_EQ(error_param(body), param) << body.dump();
  EXPECT_EQ(error_param({{"prompt", "hi"}, {"tools", json::array({weather_tool()})}}, Endpoint::kCompletions), "tools");
  EXPECT_EQ(error_param({{"prompt", "hi"}, {"functions", {{{"name", "f"}}}}}, Endpoint::kCompletions), "functions");

  // Accepted: a tool result as text parts, a call without an id, an empty tool_calls list.
  json fine = with({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", {{{"type", "text"}, {"text", "18 C"}}}}});
  EXPECT_EQ(error_param(fine), "(no error)");
  json no_id = good_call;
  no_id.erase("id");
  EXPECT_EQ(error_param(assistant_calls(json::array({no_id}))), "(no error)");
  EXPECT_EQ(error_param(with({{"role", "assistant"}, {"content", "ok"}, {"tool_calls", json::array()}})), "(no error)");
}

TEST_F(ToolConversation, ParsedRequestCarriesTheToolsAndTheFormat) {
  const ChatTemplate chatml = ChatTemplate::chatml();
  const RequestParser parser(tokenizer_, chatml, 4096);
  const ParsedRequest with_tools =
      parser.parse(Endpoint::kChat, {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", {weather_tool()}}});
  ASSERT_TRUE(with_tools.tools);
  EXPECT_EQ(with_tools.tools->tools[0].name, "get_weather");
  EXPECT_EQ(with_tools.tool_format, ToolCallFormat::kGenericJson);
  EXPECT_FALSE(parser.parse(Endpoint::kChat, {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}).tools);
}

namespace {

// The formatter of a chat request with the weather tool in `format`.
struct ToolFormatter {
  explicit ToolFormatter(ToolCallFormat format, const std::string& tool_choice = "auto", int64_t n = 1) {
    request.endpoint = Endpoint::kChat;
    GenerationRequest one;
    one.prompt = {1};
    request.requests.emplace_back(std::move(one), RequestLimits{tokenizer.vocab_size(), 64, false});
    request.prompt_texts = {""};
    request.n = n;
    request.tools = parse_tool_request({{"tools", {weather_tool()}}, {"tool_choice", tool_choice}});
    request.tool_format = format;
  }
  ResponseFormatter make() const { return ResponseFormatter(tokenizer, request, "tiny"); }

  Tokenizer tokenizer = test_util::tiny_bpe_tokenizer();
  ParsedRequest request;
};

ChoiceResult finished(const std::string& text, const std::string& reason = "stop") {
  ChoiceResult r;
  r.text = text;
  r.finish_reason = reason;
  return r;
}

ChoiceEvent event(size_t choice, const std::string& text, const std::string& finish_reason = "") {
  ChoiceEvent ev;
  ev.choice = choice;
  ev.event.index = static_cast<int32_t>(choice);
  ev.event.text = text;
  ev.event.finished = !finish_reason.empty();
  ev.event.finish_reason = finish_reason;
  return ev;
}

}  // namespace

TEST(ToolResponse, CallsBecomeMessageToolCallsWithFinishReasonToolCalls) {
  const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const ToolFormatter f(ToolCallFormat::kHermes, "auto", 3);
  const json out = f.make().response({finished(call), finished("Let me check. " + call), finished("It is sunny.")});
  ASSERT_EQ(out["choices"].size(), 3u);
  const json& first = out["choices"][0];
  EXPECT_EQ(first["finish_reason"], "tool_calls");
  EXPECT_EQ(first["message"]["role"], "assistant");
  EXPECT_TRUE(first["message"]["content"].is_null());
  ASSERT_EQ(first["message"]["tool_calls"].size(), 1u);
  const json& c = first["message"]["tool_calls"][0];
  EXPECT_EQ(c["type"], "function");
  EXPECT_EQ(c["function"]["name"], "get_weather");
  EXPECT_EQ(c["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(c["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_FALSE(c.contains("index"));
  EXPECT_EQ(out["choices"][1]["message"]["content"], "Let me check.");
  EXPECT_EQ(out["choices"][1]["finish_reason"], "tool_calls");
  EXPECT_EQ(out["choices"][2]["message"]["content"], "It is sunny.");
  EXPECT_FALSE(out["choices"][2]["message"].contains("tool_calls"));
  EXPECT_EQ(out["choices"][2]["finish_reason"], "stop");
  // A call cut by max_tokens keeps "length"; tool_choice "none" leaves the text alone.
  const json cut = f.make().response({finished(call, "length"), finished("x"), finished("y")});
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
  const json untouched = ToolFormatter(ToolCallFormat::kHermes, "none").make().response({finished(call)});
  EXPECT_EQ(untouched["choices"][0]["message"]["content"], call);
  EXPECT_EQ(untouched["choices"][0]["finish_reason"], "stop");
}

TEST(ToolResponse, StreamedCallsAreDeltaToolCallChunks) {
  const ToolFormatter f(ToolCallFormat::kGenericJson);
  ResponseFormatter formatter = f.make();
  const std::vector<std::string> pieces = {"{\"name\": \"get_", "weather\", \"arguments\": {\"city\": ", "\"Paris\"}}",
                                           "\n{\"name\": \"get_weather\", \"arguments\": {}", "} Done"};
  std::vector<json> chunks;
  for (size_t i = 0; i < pieces.size(); ++i)
    chunks.push_back(formatter.chunk(event(0, pieces[i], i + 1 == pieces.size() ? "stop" : "")));
  for (const json& c : chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    ASSERT_EQ(c["choices"].size(), 1u);
  }
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["content"], "");  // held: the name is not whole yet
  EXPECT_FALSE(chunks[0]["choices"][0]["delta"].contains("tool_calls"));
  // Named as soon as the arguments open, then the arguments as they come.
  const json& opened = chunks[1]["choices"][0]["delta"];
  EXPECT_TRUE(opened["content"].is_null());
  ASSERT_EQ(opened["tool_calls"].size(), 1u);
  EXPECT_EQ(opened["tool_calls"][0]["index"], 0);
  EXPECT_EQ(opened["tool_calls"][0]["type"], "function");
  EXPECT_EQ(opened["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(opened["tool_calls"][0]["function"]["arguments"], R"({"city":)");
  EXPECT_EQ(opened["tool_calls"][0]["id"].get<std::string>().size(), 29u);
  const json& more = chunks[2]["choices"][0]["delta"];
  ASSERT_EQ(more["tool_calls"].size(), 1u);
  EXPECT_EQ(more["tool_calls"][0]["index"], 0);
  EXPECT_FALSE(more["tool_calls"][0].contains("id"));
  EXPECT_FALSE(more["tool_calls"][0]["function"].contains("name"));
  EXPECT_EQ(more["tool_calls"][0]["function"]["arguments"], R"("Paris"})");
  EXPECT_TRUE(chunks[2]["choices"][0]["finish_reason"].is_null());
  const json& second = chunks[3]["choices"][0]["delta"];
  ASSERT_EQ(second["tool_calls"].size(), 1u);
  EXPECT_EQ(second["tool_calls"][0]["index"], 1);
  EXPECT_EQ(second["tool_calls"][0]["function"]["arguments"], "{}");
  const json& last = chunks[4]["choices"][0];
  EXPECT_EQ(last["delta"]["content"], "Done");
  EXPECT_EQ(last["finish_reason"], "tool_calls");
}

TEST(ToolResponse, StreamedTextWithoutCallsIsPlainContent) {
  ResponseFormatter formatter = ToolFormatter(ToolCallFormat::kHermes).make();
  std::string content;
  for (const char* piece : {"Hello", " there", " <tool", "box>"})
    content += formatter.chunk(event(0, piece))["choices"][0]["delta"]["content"].get<std::string>();
  const json last = formatter.chunk(event(0, "!", "stop"));
  content += last["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(content, "Hello there <toolbox>!");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
}

namespace {

class ServerTools : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);
    // A context that holds the tools (the tiny presets' is 256), and a small vocabulary: the tool grammar's
    // compile over SmolLM2's 49K tokens made this the slowest test under the sanitizers (46 s).
    synth_ = new test_util::SynthModel("tiny-llama", 0, "", 2048);
  }
  static void TearDownTestSuite() { delete synth_; }
  void SetUp() override { server_ = std::make_unique<test_util::TestServer>(*synth_->model, *synth_->tokenizer); }

  httplib::Result post(const json& body, const std::string& path = "/v1/chat/completions") const {
    return server_->client().Post(path.c_str(), body.dump(), "application/json");
  }
  static json tools_chat(bool stream) {
    return {{"messages", weather_conversation()}, {"tools", {weather_tool()}}, {"tool_choice", "required"},
            {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}, {"stream", stream}};
  }

  static test_util::SynthModel* synth_;
  std::unique_ptr<test_util::TestServer> server_;
};
test_util::SynthModel* ServerTools::synth_ = nullptr;

}  // namespace

TEST_F(ServerTools, ToolConversationsAreServedStreamedOrNot) {
  auto r = post(tools_chat(false));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json out = json::parse(r->body);
  ASSERT_EQ(out["choices"].size(), 1u);
  EXPECT_EQ(out["choices"][0]["finish_reason"], "length");  // random text: no call, cut at max_tokens
  EXPECT_EQ(out["choices"][0]["message"]["role"], "assistant");
  EXPECT_GT(out["usage"]["prompt_tokens"].get<int>(), 100);  // the tools are in the prompt

  auto s = post(tools_chat(true));
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  EXPECT_NE(s->body.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(s->body.find("\"finish_reason\":\"length\""), std::string::npos);

  for (const auto& [body, param] : std::vector<std::pair<json, std::string>>{
           {{{"prompt", "hi"}, {"tools", {weather_tool()}}}, "tools"},
           {{{"messages", weather_conversation()}, {"tools", {weather_tool(), weather_tool()}}}, "tools[1].function.name"},
           {{{"messages", weather_conversation()}, {"tools", {weather_tool()}}, {"tool_choice", "maybe"}}, "tool_choice"},
           {{{"messages", {{{"role", "tool"}, {"content", "x"}}}}}, "messages[0].tool_call_id"}}) {
    auto bad = post(body, body.contains("prompt") ? "/v1/completions" : "/v1/chat/completions");
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400) << body.dump();
    EXPECT_EQ(json::parse(bad->body)["error"]["param"], param) << bad->body;
  }
}

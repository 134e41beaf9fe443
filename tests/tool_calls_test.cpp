// Tool calling, pure parts: the request's tools, finding calls in model output
// (whole and streamed, in every format) and the shapes a grammar constrains
// calls to.
#include <gtest/gtest.h>

#include <random>

#include "server/api_error.h"
#include "server/tool_calls.h"

using namespace kvserve::server;
using json = nlohmann::json;

namespace {

json weather_tool() {
  return {{"type", "function"},
          {"function",
           {{"name", "get_weather"},
            {"description", "The weather in a city"},
            {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}}}};
}

json time_tool() { return {{"type", "function"}, {"function", {{"name", "get_time"}}}}; }

ToolRequest two_tools(bool parallel = true) {
  std::optional<ToolRequest> r = parse_tool_request(
      {{"tools", {weather_tool(), time_tool()}}, {"parallel_tool_calls", parallel}});
  EXPECT_TRUE(r.has_value());
  return *r;
}

// The param and message of the 400 a body gets.
std::pair<std::string, std::string> error_of(const json& body) {
  try {
    parse_tool_request(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    return {e.param(), e.what()};
  }
  return {"(none)", "(no error)"};
}

struct Expected {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

void expect_parse(std::string_view text, ToolCallFormat format, const Expected& want, const ToolRequest& tools = two_tools()) {
  const ParsedToolOutput got = parse_tool_calls(text, format, tools);
  EXPECT_EQ(got.content, want.content) << text;
  ASSERT_EQ(got.calls.size(), want.calls.size()) << text;
  for (size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, want.calls[i].first) << text;
    EXPECT_EQ(got.calls[i].arguments, want.calls[i].second) << text;
  }
}

}  // namespace

TEST(ToolRequest, ParsesToolsChoiceAndParallelCalls) {
  const json body = {{"tools", {weather_tool(), time_tool()}},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}},
                     {"parallel_tool_calls", false}};
  const std::optional<ToolRequest> r = parse_tool_request(body);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->tools.size(), 2u);
  EXPECT_EQ(r->tools[0].name, "get_weather");
  EXPECT_EQ(r->tools[0].description, "The weather in a city");
  EXPECT_EQ(r->tools[0].parameters, weather_tool()["function"]["parameters"]);
  EXPECT_TRUE(r->tools[1].parameters.is_null());
  EXPECT_EQ(r->choice.kind, ToolChoice::kNamed);
  EXPECT_EQ(r->choice.name, "get_time");
  EXPECT_FALSE(r->parallel_tool_calls);
  EXPECT_EQ(r->as_given, body["tools"]);
  EXPECT_EQ(r->find("get_weather"), &r->tools[0]);
  EXPECT_EQ(r->find("nope"), nullptr);

  EXPECT_EQ(parse_tool_request({{"tools", {time_tool()}}})->choice.kind, ToolChoice::kAuto);  // the default
  EXPECT_TRUE(parse_tool_request({{"tools", {time_tool()}}})->parallel_tool_calls);
  // A named function is called once, whatever parallel_tool_calls says (vLLM's named function calling).
  json named_parallel = body;
  named_parallel["parallel_tool_calls"] = true;
  EXPECT_FALSE(parse_tool_request(named_parallel)->parallel_tool_calls);
  for (const auto& [value, kind] : std::vector<std::pair<std::string, ToolChoice::Kind>>{
           {"none", ToolChoice::kNone}, {"auto", ToolChoice::kAuto}, {"required", ToolChoice::kRequired}}) {
    const std::optional<ToolRequest> r2 = parse_tool_request({{"tools", {time_tool()}}, {"tool_choice", value}});
    EXPECT_EQ(r2->choice.kind, kind) << value;
    EXPECT_EQ(r2->calls_allowed(), kind != ToolChoice::kNone);
  }
}

TEST(ToolRequest, NoToolsIsNullopt) {
  EXPECT_FALSE(parse_tool_request(json::object()));
  EXPECT_FALSE(parse_tool_request({{"tools", nullptr}}));
  EXPECT_FALSE(parse_tool_request({{"tools", json::array()}}));
  EXPECT_FALSE(parse_tool_request({{"tools", json::array()}, {"tool_choice", "none"}}));
  EXPECT_FALSE(parse_tool_request({{"tool_choice", "auto"}, {"function_call", "none"}}));
}

TEST(ToolRequest, BadInputGets400NamingTheField) {
  json too_many = json::array();
  for (int i = 0; i < 129; ++i) too_many.push_back({{"type", "function"}, {"function", {{"name", "f" + std::to_string(i)}}}});
  json long_name = time_tool();
  long_name["function"]["name"] = std::string(65, 'a');
  const json tools = {weather_tool(), time_tool()};
  const std::vector<std::tuple<json, std::string, std::string>> cases = {
      {{{"tools", "get_weather"}}, "tools", "tools must be a list"},
      {{{"tools", too_many}}, "tools", "at most 128 tools, got 129"},
      {{{"tools", {5}}}, "tools[0]", "tools[0] must be an object"},
      {{{"tools", {{{"function", {{"name", "f"}}}}}}}, "tools[0].type", "tools[0].type must be \"function\""},
      {{{"tools", {{{"type", "retrieval"}, {"function", {{"name", "f"}}}}}}}, "tools[0].type", "\"function\""},
      {{{"tools", {{{"type", "function"}}}}}, "tools[0].function", "tools[0].function must be an object"},
      {{{"tools", {time_tool(), time_tool(), {{"type", "function"}, {"function", {{"name", "get weather"}}}}}}},
       "tools[1].function.name", "already the name of tools[0]"},
      {{{"tools", {time_tool(), weather_tool(), {{"type", "function"}, {"function", {{"name", "get weather"}}}}}}},
       "tools[2].function.name", "tools[2].function.name must match ^[a-zA-Z0-9_-]{1,64}$"},
      {{{"tools", {long_name}}}, "tools[0].function.name", "must match"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", 5}}}}}}}, "tools[0].function.name", "must match"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"description", 1}}}}}}},
       "tools[0].function.description", "must be a string"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "x"}}}}}}},
       "tools[0].function.parameters", "must be a JSON schema object"},
      {{{"tools", tools}, {"tool_choice", "any"}}, "tool_choice", "got \"any\""},
      {{{"tools", tools}, {"tool_choice", 3}}, "tool_choice", "tool_choice must be"},
      {{{"tools", tools}, {"tool_choice", {{"type", "x"}}}}, "tool_choice.type", "must be \"function\""},
      {{{"tools", tools}, {"tool_choice", {{"type", "function"}}}}, "tool_choice.function.name", "must be the name"},
      {{{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_news"}}}}}},
       "tool_choice.function.name", "\"get_news\", which is not one of the request's tools"},
      {{{"tool_choice", "required"}}, "tool_choice", "the request has no tools"},
      {{{"tools", json::array()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}},
       "tool_choice", "the request has no tools"},
      {{{"tools", tools}, {"parallel_tool_calls", "yes"}}, "parallel_tool_calls", "true or false"},
      {{{"function_call", {{"name", "f"}}}}, "function_call", "send tools and tool_choice instead"},
  };
  for (const auto& [body, param, message] : cases) {
    const auto [got_param, got_message] = error_of(body);
    EXPECT_EQ(got_param, param) << body.dump();
    EXPECT_NE(got_message.find(message), std::string::npos) << body.dump() << " -> " << got_message;
  }
}

TEST(ToolCalls, FormatComesFromTheChatTemplate) {
  EXPECT_EQ(tool_call_format_for("{% if tools %}...<tool_call>\n{{ tool_call.arguments | tojson }}{% endif %}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(tool_call_format_for("{%- if tools is not none %}Respond in the format {\"name\": function name, "
                                 "\"parameters\": dictionary of argument name and its value}{% endif %}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(tool_call_format_for("{{- '<|python_tag|>' + tool_call.name }}"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(tool_call_format_for("{% for message in messages %}{{'<|im_start|>' + message['role'] }}{% endfor %}"),
            ToolCallFormat::kGenericJson);
  EXPECT_EQ(tool_call_format_for(""), ToolCallFormat::kGenericJson);
}

TEST(ToolCalls, HermesCallsAnywhereInTheText) {
  const auto f = ToolCallFormat::kHermes;
  expect_parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", f,
               {"", {{"get_weather", R"({"city":"Paris"})"}}});
  expect_parse("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"C\"}}\n"
               "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
               f, {"Let me check.", {{"get_weather", R"({"city":"Paris","unit":"C"})"}, {"get_time", "{}"}}});
  // Keys keep the model's order; arguments given as a JSON string, or left out, are taken too.
  expect_parse(R"(<tool_call>{"name": "get_weather", "arguments": {"z": 1, "a": [true, null]}}</tool_call>)", f,
               {"", {{"get_weather", R"({"z":1,"a":[true,null]})"}}});
  expect_parse(R"(<tool_call>{"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}</tool_call>)", f,
               {"", {{"get_weather", R"({"city":"Oslo"})"}}});
  expect_parse(R"(<tool_call>{"name": "get_time"}</tool_call> done)", f, {"done", {{"get_time", "{}"}}});
  // Unknown tools and broken JSON stay text...
  const std::string unknown = R"(<tool_call>{"name": "get_news", "arguments": {}}</tool_call>)";
  expect_parse("a " + unknown + " b", f, {"a " + unknown + " b", {}});
  const std::string broken = R"(<tool_call>{"name": "get_tim)";
  expect_parse(broken, f, {broken, {}});
  // ...but a call that named its tool and opened its arguments was streamed as a call already: it stays one,
  // its closing tag ending it wherever it comes.
  expect_parse(R"(<tool_call>{"name": "get_time", "arguments": {</tool_call> after)", f, {"after", {{"get_time", "{"}}});
  expect_parse(R"(<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>)", f,
               {R"(<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>)", {}});
  // An output that ends inside a call still has it when its JSON is whole.
  expect_parse("<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n", f, {"", {{"get_time", "{}"}}});
  expect_parse("x <tool_call>\n{\"name\": \"get_time\", \"argu", f, {"x <tool_call>\n{\"name\": \"get_time\", \"argu", {}});
  // Bare JSON calls, as small Qwen2.5 models write them without the tags.
  expect_parse(R"({"name": "get_weather", "arguments": {"city": "Paris"}})", f, {"", {{"get_weather", R"({"city":"Paris"})"}}});
  expect_parse(R"(Calling it: {"name": "get_time", "arguments": {}})", f, {"Calling it:", {{"get_time", "{}"}}});
  // ... or in a ```json fence, pretty-printed (Qwen2.5-Coder-1.5B's answer, word for word).
  expect_parse("```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Paris\"\n  }\n}\n```", f,
               {"", {{"get_weather", R"({"city":"Paris"})"}}});
  expect_parse("Here:\n```\n[{\"name\": \"get_time\"}]\n``` ok", f, {"Here:\n ok", {{"get_time", "{}"}}});
  expect_parse("```json\n{\"name\": \"get_time\"}\n", f, {"", {{"get_time", "{}"}}});  // the output ended in the fence
  const std::string code = "```json\n{\"city\": \"Paris\"}\n```\n```python\nprint(1)\n```";
  expect_parse(code, f, {code, {}});
  // Plain text, trimmed; whitespace alone is no content.
  expect_parse("  The answer is 4.\n", f, {"The answer is 4.", {}});
  expect_parse(" \n ", f, {"", {}});
  expect_parse("a <tool x> b", f, {"a <tool x> b", {}});
}

TEST(ToolCalls, CallIdsLookLikeOpenAIs) {
  const ParsedToolOutput out = parse_tool_calls(
      "<tool_call>{\"name\": \"get_time\"}</tool_call><tool_call>{\"name\": \"get_time\"}</tool_call>",
      ToolCallFormat::kHermes, two_tools());
  ASSERT_EQ(out.calls.size(), 2u);
  for (const ToolCall& call : out.calls) {
    ASSERT_EQ(call.id.size(), 29u);
    EXPECT_EQ(call.id.substr(0, 5), "call_");
    for (char c : call.id.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << call.id;
    EXPECT_EQ(call_id_as("toolu_", call.id), "toolu_" + call.id.substr(5));  // Anthropic's form, same characters
  }
  EXPECT_NE(out.calls[0].id, out.calls[1].id);
  EXPECT_EQ(call_id_as("fc_", "abc"), "fc_abc");  // a client's own id without the prefix: kept whole
}

TEST(ToolCalls, Llama3JsonAtTheStart) {
  const auto f = ToolCallFormat::kLlama3Json;
  expect_parse(R"({"name": "get_weather", "parameters": {"city": "Paris"}})", f, {"", {{"get_weather", R"({"city":"Paris"})"}}});
  expect_parse("<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}", f, {"", {{"get_time", "{}"}}});
  expect_parse(R"(  {"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "Rome"}})", f,
               {"", {{"get_time", "{}"}, {"get_weather", R"({"city":"Rome"})"}}});
  expect_parse(R"([{"name": "get_time", "parameters": {}}, {"name": "get_weather", "arguments": {"city": "Rome"}}])", f,
               {"", {{"get_time", "{}"}, {"get_weather", R"({"city":"Rome"})"}}});
  expect_parse(R"({"name": "get_time", "parameters": {}} and then some text)", f, {"and then some text", {{"get_time", "{}"}}});
  // JSON that is not a call is the answer itself.
  expect_parse(R"({"city": "Paris"})", f, {R"({"city": "Paris"})", {}});
  expect_parse(R"([1, 2, 3])", f, {"[1, 2, 3]", {}});
  expect_parse(R"([{"name": "get_time"}, {"name": "nope"}])", f, {R"([{"name": "get_time"}, {"name": "nope"}])", {}});
  expect_parse("{\"name\": \"get_time\", \"parameters\": {", f, {"", {{"get_time", "{"}}});  // cut short: streamed as a call
  expect_parse("<|python_ta", f, {"<|python_ta", {}});
}

TEST(ToolCalls, GenericJsonAlsoWhereAGrammarTriggersIt) {
  const auto f = ToolCallFormat::kGenericJson;
  expect_parse(R"({"name": "get_weather", "arguments": {"city": "Paris"}})", f, {"", {{"get_weather", R"({"city":"Paris"})"}}});
  expect_parse("{\"name\": \"get_time\", \"arguments\": {}}\n{\"name\": \"get_time\", \"arguments\": {}}", f,
               {"", {{"get_time", "{}"}, {"get_time", "{}"}}});
  expect_parse(R"(Sure. {"name": "get_weather", "arguments": {"city": "Paris"}} Done.)", f,
               {"Sure.  Done.", {{"get_weather", R"({"city":"Paris"})"}}});
  expect_parse(R"(Sure. {"name": "nope", "arguments": {}} {"a": "}"})", f, {R"(Sure. {"name": "nope", "arguments": {}} {"a": "}"})", {}});
  expect_parse(R"(text {"name": "get_time", "arguments": {"s": "a \"}\" b"}})", f, {"text", {{"get_time", R"({"s":"a \"}\" b"})"}}});
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  expect_parse(deep, f, {deep, {}});
  expect_parse("x {\"name\"" + deep, f, {"x {\"name\"" + deep, {}});
}

TEST(ToolCalls, ParallelCallsOffKeepsTheFirst) {
  expect_parse("<tool_call>{\"name\": \"get_time\"}</tool_call>\n<tool_call>{\"name\": \"get_weather\"}</tool_call>",
               ToolCallFormat::kHermes, {"", {{"get_time", "{}"}}}, two_tools(false));
  expect_parse(R"([{"name": "get_weather"}, {"name": "get_time"}])", ToolCallFormat::kGenericJson,
               {"", {{"get_weather", "{}"}}}, two_tools(false));
}

namespace {

// Every format's interesting outputs, for the streaming tests.
std::vector<std::pair<ToolCallFormat, std::string>> stream_cases() {
  const std::string hermes_call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P}aris\"}}\n</tool_call>";
  const std::string json_call = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
  const std::string llama_call = "{\"name\": \"get_time\", \"parameters\": {}}";
  return {
      {ToolCallFormat::kHermes, "Hello there, how are you?"},
      {ToolCallFormat::kHermes, "  Let me look.\n\n" + hermes_call + "\n" + hermes_call + "\n  and more <tool text  "},
      {ToolCallFormat::kHermes, "a <tool_call>{\"name\": \"nope\"}</tool_call> <tool_call>{\"name\": \"get_time\"}"},
      {ToolCallFormat::kHermes, "<<tool_call>x</tool_call>" + hermes_call + "<tool_cal"},
      {ToolCallFormat::kHermes, json_call + " then <tool_call>{\"name\": \"get_time\"}</tool_call> {\"name\": {\"name\""},
      {ToolCallFormat::kLlama3Json, "<|python_tag|>" + llama_call + " ;  " + llama_call + "\n\nThat is all."},
      {ToolCallFormat::kLlama3Json, "[" + llama_call + ", " + llama_call + "]"},
      {ToolCallFormat::kLlama3Json, "<|python_x {\"name\": \"get_time\"} [1, {]"},
      {ToolCallFormat::kLlama3Json, "   {\"a\": 1} then " + llama_call},
      {ToolCallFormat::kGenericJson, json_call + "\n" + json_call},
      {ToolCallFormat::kGenericJson, "Sure! " + json_call + " and {\"name\": \"x\"} and {\"name\" " + json_call + " {\"na"},
      {ToolCallFormat::kGenericJson, "{\"name\": \"get_time\", \"arguments\": \"{}\"} \t "},
      {ToolCallFormat::kGenericJson, "{ unclosed " + json_call},
      {ToolCallFormat::kGenericJson, "a ```json\n" + json_call + "\n``` b ```\n{ \"name\": \"f\"}``` ```js ``` {\"a\": 1}\n``"},
      {ToolCallFormat::kHermes, "```json\n{\n  \"name\": \"get_time\"\n}\n```\n```json\n{\"a\": 1}\n```\n```json\n["},
      // Streamed calls: escapes and brackets in strings, keys after the arguments, a missing closing tag, a cut.
      {ToolCallFormat::kHermes, "<tool_call> {\"name\" : \"get_weather\",\"arguments\":{\"q\": \"a \\\"b\\\" {c}\", \"n\": [1, {\"x\": 2}]},"
                                " \"extra\": {\"y\": \"}\"}} </tool_call>x<tool_call>{\"name\": \"get_time\", \"arguments\": {}} then"},
      {ToolCallFormat::kGenericJson, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Par"},
      // Names: an escape (parsed), a raw control byte and a byte that is not UTF-8 (not JSON strings).
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"get_\\u0074ime\", \"arguments\": {}}</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"get\ttime\", \"arguments\": {}}</tool_call> ok"},
      {ToolCallFormat::kGenericJson, "{\"name\": \"get_time\xff\", \"arguments\": {}} ok"},
  };
}

// Feeds `text` cut at `cuts` and gathers what the stream returns.
ParsedToolOutput streamed(const std::string& text, const std::vector<size_t>& cuts, ToolCallFormat format,
                          const ToolRequest& tools) {
  ToolCallStream stream(format, tools);
  ParsedToolOutput out;
  size_t from = 0;
  auto take = [&](ToolCallStream::Delta d) {
    out.content += d.content;
    add_call_pieces(out.calls, d.calls);
  };
  for (size_t cut : cuts) {
    take(stream.feed(std::string_view(text).substr(from, cut - from)));
    from = cut;
  }
  take(stream.feed(std::string_view(text).substr(from)));
  take(stream.finish());
  return out;
}

void expect_same(const ParsedToolOutput& got, const ParsedToolOutput& want, const std::string& what) {
  EXPECT_EQ(got.content, want.content) << what;
  ASSERT_EQ(got.calls.size(), want.calls.size()) << what;
  for (size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(got.calls[i].name, want.calls[i].name) << what;
    EXPECT_EQ(got.calls[i].arguments, want.calls[i].arguments) << what;
  }
}

}  // namespace

TEST(ToolCallStream, ReassembledEqualsTheWholeParseAtEverySplit) {
  const ToolRequest tools = two_tools();
  std::mt19937 rng(7);
  for (const auto& [format, text] : stream_cases()) {
    const ParsedToolOutput whole = parse_tool_calls(text, format, tools);
    for (size_t cut = 0; cut <= text.size(); ++cut)
      expect_same(streamed(text, {cut}, format, tools), whole, text + " cut at " + std::to_string(cut));
    for (size_t a = 0; a <= text.size(); ++a)  // every pair of cuts
      for (size_t b = a; b <= text.size(); b += 3) expect_same(streamed(text, {a, b}, format, tools), whole, text);
    std::vector<size_t> every(text.size());  // one byte at a time
    for (size_t i = 0; i < text.size(); ++i) every[i] = i;
    expect_same(streamed(text, every, format, tools), whole, text + " byte by byte");
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<size_t> cuts;
      for (size_t i = 0; i < text.size(); ++i)
        if (rng() % 4 == 0) cuts.push_back(i);
      expect_same(streamed(text, cuts, format, tools), whole, text + " random cuts");
    }
  }
}

TEST(ToolCallStream, ContentPassesThroughAndOnlyAPossibleOpenerIsHeld) {
  const ToolRequest tools = two_tools();
  ToolCallStream hermes(ToolCallFormat::kHermes, tools);
  EXPECT_EQ(hermes.feed("Hello").content, "Hello");
  EXPECT_EQ(hermes.feed(" world <tool").content, " world");  // the space may be trailing, "<tool" may open a call
  EXPECT_EQ(hermes.feed("box> ok").content, " <toolbox> ok");
  ToolCallStream::Delta opened = hermes.feed("\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}");
  EXPECT_EQ(opened.content, "");
  ASSERT_EQ(opened.calls.size(), 2u);  // named at once, then its arguments; open until its closing tag
  EXPECT_EQ(opened.calls[0].name, "get_time");
  EXPECT_TRUE(opened.calls[0].first);
  EXPECT_EQ(opened.calls[1].arguments, "{}");
  EXPECT_FALSE(opened.calls[1].last);
  ToolCallStream::Delta call = hermes.feed("</tool_call> after");
  ASSERT_EQ(call.calls.size(), 1u);
  EXPECT_TRUE(call.calls[0].last);
  EXPECT_EQ(call.content, "\n after");
  EXPECT_EQ(hermes.calls_so_far(), 1u);
  EXPECT_EQ(hermes.finish().content, "");

  ToolCallStream generic(ToolCallFormat::kGenericJson, tools);
  EXPECT_EQ(generic.feed("  ").content, "");
  EXPECT_EQ(generic.feed("{\"name\": \"get_time\"").content, "");  // a call may be starting: held
  EXPECT_EQ(generic.feed("}").calls.size(), 1u);
  EXPECT_EQ(generic.feed(" It is noon.").content, "It is noon.");
  EXPECT_EQ(generic.feed(" {").content, "");  // may open {"name"
  EXPECT_EQ(generic.feed("x").content, " {x");
  EXPECT_EQ(generic.finish().calls.size(), 0u);

  ToolCallStream llama(ToolCallFormat::kLlama3Json, tools);
  EXPECT_EQ(llama.feed("Paris is").content, "Paris is");  // not JSON at the start: text from here on
  EXPECT_EQ(llama.feed(" nice").content, " nice");
}

TEST(ToolCallShapes, EveryFormatsShapeParsesBack) {
  const ToolRequest tools = two_tools();
  const std::vector<std::pair<ToolCallFormat, std::pair<std::string, std::string>>> frames = {
      {ToolCallFormat::kHermes, {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", "}\n</tool_call>"}},
      {ToolCallFormat::kLlama3Json, {"{\"name\": \"get_weather\", \"parameters\": ", "}"}},
      {ToolCallFormat::kGenericJson, {"{\"name\": \"get_weather\", \"arguments\": ", "}"}},
  };
  for (const auto& [format, frame] : frames) {
    const std::vector<ToolCallShape> shapes = tool_call_shapes(tools, format);
    ASSERT_EQ(shapes.size(), 2u);
    EXPECT_EQ(shapes[0].begin, frame.first);
    EXPECT_EQ(shapes[0].end, frame.second);
    EXPECT_EQ(shapes[0].schema, tools.tools[0].parameters);
    EXPECT_EQ(shapes[1].schema, json({{"type", "object"}, {"properties", json::object()}}));  // no parameters
    const std::string text = shapes[0].begin + R"({"city": "Paris"})" + shapes[0].end + shapes[1].begin + "{}" + shapes[1].end;
    expect_parse(text, format, {"", {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}});
    expect_parse("Let me see. " + text, format, {"Let me see.", {{"get_weather", R"({"city":"Paris"})"}, {"get_time", "{}"}}});
    EXPECT_EQ(tool_call_text("get_time", "{}", format), shapes[1].begin + "{}" + shapes[1].end);
    const std::vector<std::string> triggers = tool_call_triggers(format);
    ASSERT_EQ(triggers.size(), 1u);
    EXPECT_EQ(shapes[0].begin.rfind(triggers[0], 0), 0u) << "every call starts with the trigger";
  }
  EXPECT_EQ(tool_call_triggers(ToolCallFormat::kHermes)[0], "<tool_call>");
  EXPECT_EQ(tool_call_triggers(ToolCallFormat::kLlama3Json)[0], "{\"name\"");

  ToolRequest named = tools;
  named.choice = {ToolChoice::kNamed, "get_time"};
  const std::vector<ToolCallShape> one = tool_call_shapes(named, ToolCallFormat::kHermes);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].begin, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": ");
}

// Model output is untrusted: a "call" nested without bound is never walked
// (printing or checking it would recurse that deep); it stays text.
TEST(ToolCalls, DeeplyNestedOutputStaysText) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const ParsedToolOutput out = parse_tool_calls(deep, ToolCallFormat::kGenericJson, two_tools());
  EXPECT_TRUE(out.calls.empty());
  const std::string args = "{\"name\": \"get_weather\", \"arguments\": \"" + std::string(200, '[') + std::string(200, ']') + "\"}";
  EXPECT_TRUE(parse_tool_calls(args, ToolCallFormat::kGenericJson, two_tools()).calls.empty());
}

TEST(ToolCallStream, ArgumentsStreamAsTheModelWritesThem) {
  const ToolRequest tools = two_tools();
  ToolCallStream hermes(ToolCallFormat::kHermes, tools);
  ToolCallStream::Delta a = hermes.feed("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_TRUE(a.calls[0].first);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].id.size(), 29u);
  EXPECT_EQ(a.calls[1].arguments, "{\"city\":\"Pa");  // whitespace outside strings dropped
  ToolCallStream::Delta b = hermes.feed("ris, FR\", \"days\": [1, 2]}");
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].arguments, "ris, FR\",\"days\":[1,2]}");
  EXPECT_FALSE(b.calls[0].last);
  ToolCallStream::Delta c = hermes.feed("}\n</tool_call>");
  ASSERT_EQ(c.calls.size(), 1u);
  EXPECT_TRUE(c.calls[0].last);
  EXPECT_EQ(c.calls[0].arguments, "");
  const ParsedToolOutput whole = parse_tool_calls(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris, FR\", \"days\": [1, 2]}}\n</tool_call>",
      ToolCallFormat::kHermes, tools);
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.calls[0].arguments, "{\"city\":\"Paris, FR\",\"days\":[1,2]}");

  // Cut short inside the arguments: the call stays a call (finish_reason tells the client why it is partial).
  ToolCallStream cut(ToolCallFormat::kGenericJson, tools);
  std::vector<ToolCall> calls;
  add_call_pieces(calls, cut.feed("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Ro").calls);
  ToolCallStream::Delta end = cut.finish();
  ASSERT_EQ(end.calls.size(), 1u);
  EXPECT_TRUE(end.calls[0].last);
  add_call_pieces(calls, end.calls);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, "{\"city\":\"Ro");

  // Arguments given before the name, or as a string: found whole once the call closes.
  ToolCallStream later(ToolCallFormat::kGenericJson, tools);
  EXPECT_TRUE(later.feed("{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"").calls.empty());
  ToolCallStream::Delta whole_call = later.feed("}");
  ASSERT_EQ(whole_call.calls.size(), 1u);
  EXPECT_TRUE(whole_call.calls[0].first && whole_call.calls[0].last);
  EXPECT_EQ(whole_call.calls[0].arguments, "{\"city\":\"Oslo\"}");
}

// A request's one path through the server (issue 32): the body parsed once
// (a schema's written key order copied during that parse), every engine
// request validated by the same function Engine::submit uses, and the chat
// template's capabilities learned once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/request_validation.h"
#include "engine/stop_strings.h"
#include "server/chat_template_capabilities.h"
#include "server/json_input.h"
#include "server_harness.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

// The param and message of the RequestError validate_request throws, or ("", "ok").
std::pair<std::string, std::string> refusal(const GenerationRequest& r, const RequestLimits& limits) {
  try {
    validate_request(r, limits);
  } catch (const RequestError& e) {
    return {e.param(), e.what()};
  }
  return {"", "ok"};
}

}  // namespace

// Each refusal names the field it is about; the messages are Engine::submit's.
TEST(RequestValidation, EachRefusalNamesItsField) {
  const RequestLimits limits{100, 64, false};
  GenerationRequest ok;
  ok.prompt = {1, 2, 3};
  EXPECT_EQ(refusal(ok, limits).second, "ok");
  auto with = [&](auto change) {
    GenerationRequest r = ok;
    change(r);
    return refusal(r, limits);
  };
  using Refusal = std::pair<std::string, std::string>;
  EXPECT_EQ(with([](GenerationRequest& r) { r.prompt.clear(); }), Refusal("prompt", "the prompt is empty"));
  EXPECT_EQ(with([](GenerationRequest& r) { r.prompt.assign(64, 1); }),
            Refusal("prompt", "the prompt has 64 tokens; the context size is 64 tokens"));
  EXPECT_EQ(with([](GenerationRequest& r) { r.prompt[1] = 100; }),
            Refusal("prompt", "prompt token id 100 is outside the vocabulary"));
  EXPECT_EQ(with([](GenerationRequest& r) { r.max_tokens = -1; }), Refusal("max_tokens", "max_tokens must be >= 0, got -1"));
  EXPECT_EQ(with([](GenerationRequest& r) { r.n = kMaxSequences + 1; }),
            Refusal("n", "n (parallel samples) must be in [1, 128], got 129"));
  EXPECT_EQ(with([](GenerationRequest& r) { r.sampling.top_p = 0; }).first, "top_p");
  EXPECT_EQ(with([](GenerationRequest& r) { r.sampling.temperature = -1; }).first, "temperature");
  EXPECT_EQ(with([](GenerationRequest& r) { r.speculation.mode = SpeculativeMode::kDraftModel; }).first,
            "speculative.mode");
  EXPECT_EQ(with([](GenerationRequest& r) { r.logit_bias = {{100, 1.0f}}; }).first, "logit_bias");
  EXPECT_EQ(with([](GenerationRequest& r) { r.stop_token_ids = {-1}; }).first, "stop_token_ids");
  EXPECT_EQ(with([](GenerationRequest& r) { r.min_tokens = -1; }).first, "min_tokens");
  EXPECT_EQ(with([](GenerationRequest& r) { r.stop.assign(kMaxStopStrings + 1, "x"); }),
            Refusal("stop", "at most 16 stop strings, got 17"));
  EXPECT_EQ(with([](GenerationRequest& r) { r.stop = {std::string(kMaxStopStringBytes + 1, 'x')}; }),
            Refusal("stop", "a stop string may be at most 256 bytes, got one of 257"));
}

// A prompt shorter than the model's context (the server's limit) but not than
// the engine's (its KV pool holds 4 blocks of 16 tokens) was refused by
// Engine::submit with a 400 naming no field; the server now applies the
// engine's check itself and names the field.
TEST(RequestValidation, PromptPastTheKvPoolGets400NamingItsField) {
  test_util::SynthModel synth;
  EngineOptions options;
  options.kv_blocks = 4;
  test_util::TestServer server(*synth.model, *synth.tokenizer, options);
  ASSERT_EQ(synth.model->config().context_length, 256);
  auto post = [&](const char* path, const json& body) {
    auto r = server.client().Post(path, body.dump(), "application/json");
    return std::pair<int, json>(r ? r->status : -1, r ? json::parse(r->body, nullptr, false) : json());
  };
  auto [status, error] = post("/v1/completions", {{"prompt", std::vector<int>(100, 5)}, {"max_tokens", 1}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "prompt") << error;
  EXPECT_EQ(error["error"]["message"], "the prompt has 100 tokens; the context size is 64 tokens") << error;

  std::string words;
  while (synth.tokenizer->encode(words, false).size() <= 80) words += "cat ";
  std::tie(status, error) = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", words}}}},
                                                          {"max_tokens", 1}});
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "messages") << error;

  std::tie(status, error) = post("/v1/completions", {{"prompt", std::vector<int>(40, 5)}, {"max_tokens", 1}});
  EXPECT_EQ(status, 200) << error;
}

// One parse gives the tree (keys sorted) and, at the asked paths, the objects
// in their written order: the last of duplicate keys, as the tree keeps it.
TEST(JsonKeyOrder, OneParseCopiesTheObjectsAtThePathsInWrittenOrder) {
  const std::string text =
      R"({"a": {"z": 1, "y": 2}, "list": [{"z": 1, "y": 2}], "b": {"s": {"z": [1, {"k": 2, "j": 3}], "y": null}},)"
      R"( "a": {"z": 3, "c": {"q": 1, "p": 2}}})";
  const server::JsonKeepingOrder parsed =
      server::parse_limited_json_keeping_order(text, {{"a"}, {"list"}, {"b", "s"}, {"missing"}});
  EXPECT_EQ(parsed.tree, json::parse(text));
  ASSERT_EQ(parsed.ordered.size(), 2u);
  EXPECT_EQ(parsed.ordered.at({"a"}).dump(), R"({"z":3,"c":{"q":1,"p":2}})");
  EXPECT_EQ(parsed.ordered.at({"b", "s"}).dump(), R"({"z":[1,{"k":2,"j":3}],"y":null})");
  const server::JsonKeepingOrder root = server::parse_limited_json_keeping_order(R"({"b": 1, "a": 2})", {{}});
  EXPECT_EQ(root.ordered.at({}).dump(), R"({"b":1,"a":2})");
}

// An object too wide to keep in order (its parse as ordered_json would be
// quadratic) is not copied, and does not fail the parse: its keys stay sorted.
// An earlier copy at the same path goes too (the tree holds the later object).
TEST(JsonKeyOrder, AnObjectTooWideToOrderIsNotCopied) {
  std::string wide = "{";
  for (int i = 0; i < 10000; ++i) wide += (i ? ",\"" : "\"") + std::to_string(10000 - i) + "\":0";
  wide += "}";
  const server::JsonKeepingOrder parsed =
      server::parse_limited_json_keeping_order(R"({"s": {"b": 1, "a": 2}, "s": )" + wide + "}", {{"s"}});
  EXPECT_EQ(parsed.tree["s"].size(), 10000u);
  EXPECT_TRUE(parsed.ordered.empty());
}

// What the server reads from the template's source is read once, when it takes the template.
TEST(ChatTemplateCapabilities, AreReadFromTheSourceOnce) {
  const auto chatml = server::ChatTemplateCapabilities::of(ChatTemplate::chatml());
  EXPECT_FALSE(chatml.knows_tools);
  EXPECT_EQ(chatml.tool_format, server::ToolCallFormat::kGenericJson);
  const auto hermes = server::ChatTemplateCapabilities::of(
      ChatTemplate::parse("{% if tools %}<tool_call>{% endif %}{{ messages[0]['content'] }}"));
  EXPECT_TRUE(hermes.knows_tools);
  EXPECT_EQ(hermes.tool_format, server::ToolCallFormat::kHermes);
}

// Reasoning models: the output split into reasoning_content and content at
// the <think> tags (whatever pieces the tags arrive in), templates that open
// the tag themselves, chat_template_kwargs (Qwen3's enable_thinking), earlier
// turns' reasoning handed to the template, reasoning tokens in usage, and the
// same split through the server streamed and not.
#include <gtest/gtest.h>

#include <httplib.h>
#include <signal.h>

#include "server/api_error.h"
#include "server/reasoning.h"
#include "server/request_parser.h"
#include "server/response_format.h"
#include "server_harness.h"
#include "tiny_vocab.h"

using namespace kvserve;
using namespace kvserve::server;
using json = nlohmann::json;

namespace {

// Written for these tests to behave as Qwen3's template does (read from the
// model's tokenizer.chat_template): an assistant turn's reasoning, from
// reasoning_content or from <think> tags in its content, is shown only for
// turns after the last user message; enable_thinking false writes an empty
// reasoning block into the generation prompt.
constexpr const char* kQwen3LikeTemplate =
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content %}{%- set reasoning = '' %}"
    "{%- if message.reasoning_content is string %}{%- set reasoning = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip() %}"
    "{%- set content = content.split('</think>')[-1].strip() %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.index0 > ns.last_query and reasoning %}{{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}";

// DeepSeek-R1's habit: the generation prompt opens the reasoning block itself.
constexpr const char* kOpensThinkTemplate =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}";

ReasoningSplitter::Parts split(const std::vector<std::string>& pieces, bool starts_in_reasoning) {
  ReasoningSplitter splitter(ReasoningSyntax{}, starts_in_reasoning);
  ReasoningSplitter::Parts out;
  for (const std::string& piece : pieces) {
    ReasoningSplitter::Parts p = splitter.feed(piece);
    out.reasoning += p.reasoning;
    out.content += p.content;
  }
  ReasoningSplitter::Parts last = splitter.finish();
  out.reasoning += last.reasoning;
  out.content += last.content;
  return out;
}

// Every way of cutting `text` into three pieces gives the split of the whole.
void expect_split_anywhere(const std::string& text, bool starts_in_reasoning, const std::string& reasoning,
                           const std::string& content) {
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); ++j) {
      const ReasoningSplitter::Parts p =
          split({text.substr(0, i), text.substr(i, j - i), text.substr(j)}, starts_in_reasoning);
      ASSERT_EQ(p.reasoning, reasoning) << "cut at " << i << ", " << j;
      ASSERT_EQ(p.content, content) << "cut at " << i << ", " << j;
    }
}

}  // namespace

TEST(ReasoningSplitter, SplitsAtTheTagsWhereverThePiecesAreCut) {
  expect_split_anywhere("<think>\nStep one.\nStep two.\n</think>\n\nThe answer.", false, "Step one.\nStep two.",
                        "The answer.");
  expect_split_anywhere("  <think>a < b </thin</think>x </think>", false, "a < b </thin", "x </think>");
  // The prompt opened the block: only the end tag comes.
  expect_split_anywhere("Hmm.\n</think>\n\nYes.", true, "Hmm.", "Yes.");
  // No start tag at the start: the whole output is the answer, tags and all.
  expect_split_anywhere("Hello <think>x</think> there", false, "", "Hello <think>x</think> there");
  // Cut short by max_tokens: what follows the start tag is reasoning; half a tag is text.
  expect_split_anywhere("<think>still going </thi", false, "still going </thi", "");
  expect_split_anywhere("<thi", false, "", "<thi");
  expect_split_anywhere("", true, "", "");
}

TEST(ReasoningSplitter, KnowsWhenTheReasoningEnds) {
  ReasoningSplitter s(ReasoningSyntax{}, false);
  EXPECT_EQ(s.feed("<think>ab").reasoning, "ab");
  EXPECT_TRUE(s.in_reasoning());
  EXPECT_EQ(s.feed("c</th").reasoning, "c");  // "</th" may begin the end tag: held
  const ReasoningSplitter::Parts p = s.feed("ink>Done");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "Done");
  EXPECT_FALSE(s.in_reasoning());
}

TEST(ReasoningSyntax, ComesFromTheTemplateAndThePrompt) {
  EXPECT_TRUE(reasoning_syntax_for(kQwen3LikeTemplate).has_value());
  EXPECT_FALSE(reasoning_syntax_for(ChatTemplate::chatml().source()).has_value());
  const ReasoningSyntax syntax;
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n", syntax));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", syntax));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>user\n<think> is a tag<|im_end|>\n<|im_start|>assistant\n", syntax));
}

namespace {

class ReasoningRequest : public ::testing::Test {
 protected:
  ParsedRequest parse(const ChatTemplate& chat_template, const json& body) const {
    const RequestParser parser(tokenizer_, chat_template, 4096);
    return parser.parse(Endpoint::kChat, body);
  }
  std::string prompt_text(const ChatTemplate& chat_template, const json& body) const {
    return parse(chat_template, body).prompt_texts.at(0);
  }
  ApiError parse_error(const json& body) const {
    try {
      parse(qwen3_, body);
    } catch (const ApiError& e) {
      return e;
    }
    ADD_FAILURE() << "no error for " << body.dump();
    return ApiError(400, "");
  }

  Tokenizer tokenizer_ = test_util::tiny_bpe_tokenizer();
  ChatTemplate qwen3_ = ChatTemplate::parse(kQwen3LikeTemplate);
  json user_ = {{"role", "user"}, {"content", "Why?"}};
};

}  // namespace

TEST_F(ReasoningRequest, EnableThinkingReachesTheTemplate) {
  const ParsedRequest thinking = parse(qwen3_, {{"messages", {user_}}});
  EXPECT_EQ(thinking.prompt_texts[0], "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_TRUE(thinking.reasoning.has_value());
  EXPECT_FALSE(thinking.reasoning_open);  // the model writes <think> itself
  const json off = {{"messages", {user_}}, {"chat_template_kwargs", {{"enable_thinking", false}}}};
  const ParsedRequest quiet = parse(qwen3_, off);
  EXPECT_EQ(quiet.prompt_texts[0],
            "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_FALSE(quiet.reasoning_open);
  // A template that opens the block: the output starts inside it.
  const ParsedRequest opened = parse(ChatTemplate::parse(kOpensThinkTemplate), {{"messages", {user_}}});
  ASSERT_TRUE(opened.reasoning.has_value());
  EXPECT_TRUE(opened.reasoning_open);
  // reasoning_format "none" leaves the tags in the content; ChatML models have no reasoning.
  EXPECT_FALSE(parse(qwen3_, {{"messages", {user_}}, {"reasoning_format", "none"}}).reasoning.has_value());
  EXPECT_FALSE(parse(ChatTemplate::chatml(), {{"messages", {user_}}}).reasoning.has_value());
}

TEST_F(ReasoningRequest, EarlierReasoningIsShownAsTheTemplateDecides) {
  // Before the last user message: dropped, whether given as reasoning_content or as tags in the content.
  const json history = {{"messages",
                         {user_,
                          {{"role", "assistant"}, {"content", "Because."}, {"reasoning_content", "Let me see."}},
                          {{"role", "user"}, {"content", "Sure?"}},
                          {{"role", "assistant"}, {"content", "<think>\nChecking.\n</think>\n\nYes."}}}}};
  const std::string prompt = prompt_text(qwen3_, history);
  EXPECT_EQ(prompt.find("Let me see."), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|im_start|>assistant\nBecause.<|im_end|>"), std::string::npos) << prompt;
  // After it (the turn in progress): kept.
  EXPECT_NE(prompt.find("<|im_start|>assistant\n<think>\nChecking.\n</think>\n\nYes.<|im_end|>"), std::string::npos)
      << prompt;
}

TEST_F(ReasoningRequest, BadFieldsAreNamed) {
  EXPECT_EQ(parse_error({{"messages", {user_}}, {"chat_template_kwargs", "x"}}).param(), "chat_template_kwargs");
  EXPECT_EQ(parse_error({{"messages", {user_}}, {"reasoning_effort", "max"}}).param(), "reasoning_effort");
  EXPECT_EQ(parse_error({{"messages", {user_}}, {"reasoning_format", 1}}).param(), "reasoning_format");
  json bad = user_;
  bad["role"] = "assistant";
  bad["reasoning_content"] = 5;
  EXPECT_EQ(parse_error({{"messages", {user_, bad}}}).param(), "messages[1].reasoning_content");
  // The template's own variables are not overridden.
  const json kwargs = {{"messages", {user_}}, {"chat_template_kwargs", {{"add_generation_prompt", false}}}};
  EXPECT_EQ(prompt_text(qwen3_, kwargs), "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n");
}

namespace {

ChoiceEvent event(const Tokenizer& tokenizer, const std::string& text, int64_t tokens_before, bool last) {
  ChoiceEvent ev;
  ev.event.text = text;
  ev.event.tokens = tokenizer.encode(text, false);
  ev.event.completion_tokens = tokens_before + static_cast<int64_t>(ev.event.tokens.size());
  ev.event.finished = last;
  ev.event.finish_reason = last ? "stop" : "";
  return ev;
}

}  // namespace

TEST_F(ReasoningRequest, StreamedAndWholeResponsesSplitAlike) {
  const ParsedRequest request = parse(qwen3_, {{"messages", {user_}}});
  const std::vector<std::string> pieces = {"<thi", "nk>\nFirst", " thought.\n</", "think>", "\n\nThe", " answer."};
  ResponseFormatter streaming(tokenizer_, request, "tiny");
  std::string reasoning, content;
  json last;
  ChoiceResult whole;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const ChoiceEvent ev = event(tokenizer_, pieces[i], whole.completion_tokens, i + 1 == pieces.size());
    whole.add(ev.event);
    last = streaming.chunk(ev);
    const json& delta = last["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content")) content += delta["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "First thought.");
  EXPECT_EQ(content, "The answer.");
  // Up to the token that ends "</think>": every piece's tokens but the last two pieces'.
  int64_t reasoning_tokens = 0;
  for (size_t i = 0; i + 2 < pieces.size(); ++i) reasoning_tokens += static_cast<int64_t>(tokenizer_.encode(pieces[i], false).size());
  EXPECT_EQ(streaming.usage_chunk()["usage"]["completion_tokens_details"]["reasoning_tokens"], reasoning_tokens);
  const json out = ResponseFormatter(tokenizer_, request, "tiny").response({whole});
  const json& message = out["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "First thought.");
  EXPECT_EQ(message["content"], "The answer.");
  EXPECT_EQ(out["usage"]["completion_tokens_details"]["reasoning_tokens"], reasoning_tokens);
}

namespace {

// A synth qwen3 file carrying the Qwen3-like template, served with the
// template read from the file (as `kvserve serve` reads it).
class ReasoningServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);
    qwen3_ = new test_util::SynthModel("tiny-qwen3", 0, kQwen3LikeTemplate);
  }
  static void TearDownTestSuite() {
    delete qwen3_;
    qwen3_ = nullptr;
  }
  void SetUp() override {
    server_ = std::make_unique<test_util::TestServer>(*qwen3_->model, *qwen3_->tokenizer, EngineOptions{},
                                                      std::vector<std::string>{}, ConnectionGateLimits{},
                                                      std::vector<std::string>{},
                                                      ChatTemplate::for_model(qwen3_->model->file()));
  }
  static inline test_util::SynthModel* qwen3_ = nullptr;
  // A random model made to write `text` (a one-choice constraint).
  json body(const std::string& text, bool stream) const {
    return {{"messages", {{{"role", "user"}, {"content", "Why?"}}}}, {"guided_choice", {text}},
            {"stream", stream}, {"stream_options", {{"include_usage", true}}}, {"max_tokens", 64},
            {"temperature", 0}};  // greedy: the same tokens each time (the text can be tokenized many ways)
  }

  std::unique_ptr<test_util::TestServer> server_;
};

}  // namespace

TEST_F(ReasoningServer, ReasoningContentStreamedAndNot) {
  const std::string text = "<think>\nI think so.\n</think>\n\nHello world";
  auto whole = server_->client().Post("/v1/chat/completions", body(text, false).dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json out = json::parse(whole->body);
  EXPECT_EQ(out["choices"][0]["message"]["reasoning_content"], "I think so.");
  EXPECT_EQ(out["choices"][0]["message"]["content"], "Hello world");
  const int64_t reasoning_tokens = out["usage"]["completion_tokens_details"]["reasoning_tokens"];
  EXPECT_GT(reasoning_tokens, 0);
  EXPECT_LT(reasoning_tokens, out["usage"]["completion_tokens"].get<int64_t>());

  auto streamed = server_->client().Post("/v1/chat/completions", body(text, true).dump(), "application/json");
  ASSERT_TRUE(streamed);
  std::string reasoning, content;
  json usage;
  for (const test_util::SseEvent& ev : test_util::sse_events(streamed->body)) {
    if (ev.data == "[DONE]") continue;
    const json chunk = json::parse(ev.data);
    if (chunk.contains("usage")) usage = chunk["usage"];
    for (const json& choice : chunk["choices"]) {
      if (choice["delta"].contains("reasoning_content")) reasoning += choice["delta"]["reasoning_content"].get<std::string>();
      if (choice["delta"].contains("content")) content += choice["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(reasoning, "I think so.");
  EXPECT_EQ(content, "Hello world");
  EXPECT_EQ(usage["completion_tokens_details"]["reasoning_tokens"], reasoning_tokens);
}

// enable_thinking false (the template writes an empty block): the answer is
// all content, and a constraint applies from the first token.
TEST_F(ReasoningServer, ThinkingOffIsAllContent) {
  json request = body("Hello world", false);
  request["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto r = server_->client().Post("/v1/chat/completions", request.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json out = json::parse(r->body);
  EXPECT_EQ(out["choices"][0]["message"]["content"], "Hello world");
  EXPECT_TRUE(out["choices"][0]["message"]["reasoning_content"].is_null());
  EXPECT_EQ(out["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
}

namespace {

// A template that opens the reasoning block (DeepSeek-R1's habit): a random
// model then thinks until the budget forces the end tag.
class ReasoningBudgetServer : public test_util::SynthModelSuite {
 protected:
  void SetUp() override {
    server_ = std::make_unique<test_util::TestServer>(*synth_->model, *synth_->tokenizer, EngineOptions{},
                                                      std::vector<std::string>{}, ConnectionGateLimits{},
                                                      std::vector<std::string>{}, ChatTemplate::parse(kOpensThinkTemplate));
  }
  static json chat(json extra) {
    json body = {{"messages", {{{"role", "user"}, {"content", "Why?"}}}}, {"max_tokens", 32}, {"temperature", 0}};
    body.update(extra);
    return body;
  }
  httplib::Result post(const json& body, const char* path = "/v1/chat/completions") const {
    return server_->client().Post(path, body.dump(), "application/json");
  }
  // The thinking's tokens: the budget, up to 4 more finishing a UTF-8 character (a random model writes
  // many byte tokens), and the forced end tag.
  void expect_budget_kept(const json& out, int64_t budget) const {
    const int64_t thought = out["usage"]["completion_tokens_details"]["reasoning_tokens"];
    EXPECT_GE(thought, budget + end_tag_tokens()) << out.dump();
    EXPECT_LE(thought, budget + 4 + end_tag_tokens()) << out.dump();
  }
  int64_t end_tag_tokens() const { return static_cast<int64_t>(synth_->tokenizer->encode("</think>", false, true).size()); }

  std::unique_ptr<test_util::TestServer> server_;
};

}  // namespace

TEST_F(ReasoningBudgetServer, TheBudgetEndsTheThinkingAndTheConstraintAppliesAfterIt) {
  const json body = chat({{"thinking_token_budget", 6}, {"guided_choice", {"Hello world"}}});
  auto whole = post(body);
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json out = json::parse(whole->body);
  const json& message = out["choices"][0]["message"];
  EXPECT_EQ(message["content"], "Hello world");
  EXPECT_TRUE(message.contains("reasoning_content"));
  EXPECT_EQ(out["choices"][0]["finish_reason"], "stop");
  expect_budget_kept(out, 6);

  json streamed_body = body;
  streamed_body["stream"] = true;
  auto streamed = post(streamed_body);
  ASSERT_TRUE(streamed);
  std::string reasoning, content;
  for (const test_util::SseEvent& ev : test_util::sse_events(streamed->body)) {
    if (ev.data == "[DONE]") continue;
    const json chunk = json::parse(ev.data);
    for (const json& choice : chunk["choices"]) {
      if (choice["delta"].contains("reasoning_content")) reasoning += choice["delta"]["reasoning_content"].get<std::string>();
      if (choice["delta"].contains("content") && choice["delta"]["content"].is_string())
        content += choice["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(reasoning, message["reasoning_content"]);
  EXPECT_EQ(content, "Hello world");
}

TEST_F(ReasoningBudgetServer, WithoutABudgetTheConstraintWaitsForTheEndTag) {
  auto r = post(chat({{"guided_choice", {"Hello world"}}, {"max_tokens", 12}, {"ignore_eos", true}}));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json out = json::parse(r->body);
  EXPECT_EQ(out["choices"][0]["finish_reason"], "length");  // thought all along: the choice never began
  EXPECT_EQ(out["usage"]["completion_tokens_details"]["reasoning_tokens"], 12);
}

TEST_F(ReasoningBudgetServer, BudgetFieldsAndAnthropicsBudgetTokens) {
  for (const char* name : {"thinking_token_budget", "thinking_budget"}) {
    auto r = post(chat({{name, 3}, {"ignore_eos", true}, {"max_tokens", 10}}));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    expect_budget_kept(json::parse(r->body), 3);
  }
  auto zero = post(chat({{"thinking_token_budget", 0}, {"ignore_eos", true}, {"max_tokens", 10}}));
  ASSERT_TRUE(zero);
  EXPECT_EQ(json::parse(zero->body)["usage"]["completion_tokens_details"]["reasoning_tokens"], end_tag_tokens());

  for (const json& bad : {json{{"thinking_token_budget", "x"}}, json{{"thinking_budget", -2}},
                          json{{"thinking_token_budget", 3}, {"thinking_budget", 4}}}) {
    auto r = post(chat(bad));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad.dump();
    EXPECT_EQ(json::parse(r->body)["error"]["param"], bad.contains("thinking_budget") ? "thinking_budget" : "thinking_token_budget");
  }

  const json messages = {{"model", "m"}, {"max_tokens", 16}, {"temperature", 0},
                         {"messages", {{{"role", "user"}, {"content", "Why?"}}}},
                         {"thinking", {{"type", "enabled"}, {"budget_tokens", 4}}}};
  auto m = post(messages, "/v1/messages");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200) << m->body;
  const json reply = json::parse(m->body);
  ASSERT_FALSE(reply["content"].empty());
  EXPECT_EQ(reply["content"][0]["type"], "thinking");
}

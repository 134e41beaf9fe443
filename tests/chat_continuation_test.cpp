// Assistant prefill (vLLM's continue_final_message and add_generation_prompt,
// Anthropic's final assistant message) and vLLM's /tokenize and /detokenize
// shapes beside llama-server's.
#include <gtest/gtest.h>

#include <httplib.h>
#include <signal.h>

#include "server/anthropic_messages.h"
#include "server/api_error.h"
#include "server/request_parser.h"
#include "server_harness.h"
#include "tiny_vocab.h"

using namespace kvserve;
using namespace kvserve::server;
using json = nlohmann::json;

namespace {

class ChatContinuation : public ::testing::Test {
 protected:
  std::string prompt(const json& body) const {
    return RequestParser(tokenizer_, chatml_, 4096).parse(Endpoint::kChat, body).prompt_texts.at(0);
  }
  ApiError error(const json& body) const {
    try {
      prompt(body);
    } catch (const ApiError& e) {
      return e;
    }
    ADD_FAILURE() << "no error for " << body.dump();
    return ApiError(400, "");
  }

  Tokenizer tokenizer_ = test_util::tiny_bpe_tokenizer();
  ChatTemplate chatml_ = ChatTemplate::chatml();
  json user_ = {{"role", "user"}, {"content", "Tell a story."}};
  json prefill_ = {{"role", "assistant"}, {"content", "Once upon a time "}};
};

}  // namespace

TEST_F(ChatContinuation, TheFinalAssistantMessageIsContinued) {
  const std::string continued =
      prompt({{"messages", {user_, prefill_}}, {"continue_final_message", true}, {"add_generation_prompt", false}});
  EXPECT_EQ(continued, "<|im_start|>user\nTell a story.<|im_end|>\n<|im_start|>assistant\nOnce upon a time");
  // Without it the final message is a finished turn, then (by default) a new assistant header.
  EXPECT_EQ(prompt({{"messages", {user_, prefill_}}}),
            "<|im_start|>user\nTell a story.<|im_end|>\n<|im_start|>assistant\nOnce upon a time <|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(prompt({{"messages", {user_}}, {"add_generation_prompt", false}}), "<|im_start|>user\nTell a story.<|im_end|>\n");
  EXPECT_EQ(error({{"messages", {user_}}, {"continue_final_message", true}}).param(), "continue_final_message");
  EXPECT_EQ(error({{"messages", {user_, prefill_}}, {"continue_final_message", true}, {"add_generation_prompt", true}})
                .param(),
            "continue_final_message");
  EXPECT_EQ(error({{"messages", {user_}}, {"add_generation_prompt", "yes"}}).param(), "add_generation_prompt");
}

TEST_F(ChatContinuation, AnthropicPrefillContinuesTheAnswer) {
  const json chat = chat_body_from_messages({{"max_tokens", 8}, {"messages", {user_, prefill_}}});
  EXPECT_EQ(chat["continue_final_message"], true);
  EXPECT_EQ(chat["add_generation_prompt"], false);
  EXPECT_EQ(prompt(chat), "<|im_start|>user\nTell a story.<|im_end|>\n<|im_start|>assistant\nOnce upon a time");
  EXPECT_FALSE(chat_body_from_messages({{"max_tokens", 8}, {"messages", {user_}}}).contains("continue_final_message"));
}

namespace {

class TokenizeShapes : public test_util::SynthModelSuite {
};

json post(httplib::Client& c, const char* path, const json& body, int expected_status = 200) {
  auto r = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return nullptr;
  EXPECT_EQ(r->status, expected_status) << r->body;
  return json::parse(r->body);
}

}  // namespace

TEST_F(TokenizeShapes, VllmAndLlamaServerShapesBothWork) {
  test_util::TestServer server(*synth_->model, *synth_->tokenizer);
  httplib::Client c = server.client();
  const json llama = post(c, "/tokenize", {{"content", "hello world"}});
  const json vllm = post(c, "/tokenize", {{"prompt", "hello world"}, {"add_special_tokens", false},
                                          {"return_token_strs", true}});
  EXPECT_EQ(vllm["tokens"], llama["tokens"]);
  EXPECT_EQ(vllm["count"], llama["tokens"].size());
  EXPECT_EQ(vllm["max_model_len"], 256);
  ASSERT_EQ(vllm["token_strs"].size(), vllm["tokens"].size());
  std::string joined;
  for (const json& piece : vllm["token_strs"]) joined += piece.get<std::string>();
  EXPECT_EQ(joined, "hello world");
  // Chat messages: the prompt the chat endpoint would see.
  const json chat = post(c, "/tokenize", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  const json answer = post(c, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                                      {"max_tokens", 1}});
  EXPECT_EQ(chat["count"], answer["usage"]["prompt_tokens"]);
  const json back = post(c, "/detokenize", {{"tokens", llama["tokens"]}});
  EXPECT_EQ(back["prompt"], "hello world");
  EXPECT_EQ(back["content"], back["prompt"]);
  EXPECT_EQ(post(c, "/tokenize", {{"prompt", 5}}, 400)["error"]["param"], "prompt");
}

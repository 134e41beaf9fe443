// libFuzzer target: a chat template parsed and applied. The input is the
// template, optionally followed by a NUL byte and the last message's content.
// Only kvserve::Error may come out; the limits (chat_template_ast.h) keep
// every template within bounded time and memory.
#include <string_view>

#include "core/error.h"
#include "tokenizer/chat_template.h"

using namespace kvserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view source = input.substr(0, split);
  const std::string content(split == std::string_view::npos ? "Bye" : input.substr(split + 1));
  ChatTemplateInputs in;
  in.messages = nlohmann::json::array({{{"role", "system"}, {"content", "Be brief."}},
                                       {{"role", "user"}, {"content", "Hi"}},
                                       {{"role", "assistant"}, {"content", "Hello!"}},
                                       {{"role", "user"}, {"content", content}}});
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.add_generation_prompt = size % 2 == 0;
  try {
    ChatTemplate::parse(source).apply(in);
  } catch (const Error&) {
  }
  return 0;
}

// libFuzzer target: a chat template parsed and applied. The input is the
// template, optionally followed by a NUL byte and the last message's content,
// optionally followed by a NUL byte and a decimal count: the content repeated
// that many times (up to 16 MiB in all, a request body's limit), so that the
// fuzzer reaches large inputs cheaply, as it reaches large strings through
// `'x' * 67108864` in the template. Only kvserve::Error may come out; the
// limits (chat_template_ast.h) keep every template within bounded time and
// memory, inside scripts/fuzz.sh's -timeout and -rss_limit_mb (with a lower
// work budget: the other limits are the server's).
#include <algorithm>
#include <charconv>
#include <string_view>

#include "core/error.h"
#include "tokenizer/chat_template.h"

using namespace kvserve;

namespace {

constexpr size_t kMaxContentBytes = 16 << 20;

// "content" or "content\0count": the content, repeated count times within kMaxContentBytes.
std::string message_content(std::string_view spec) {
  const size_t split = spec.find('\0');
  const std::string_view unit = spec.substr(0, split);
  size_t count = 1;
  if (split != std::string_view::npos) {
    const std::string_view digits = spec.substr(split + 1);
    std::from_chars(digits.data(), digits.data() + digits.size(), count);
  }
  if (unit.empty()) return {};  // nothing to repeat (a count alone would loop for nothing)
  count = std::min(count, kMaxContentBytes / unit.size());
  std::string out;
  out.reserve(unit.size() * count);
  for (size_t i = 0; i < count; ++i) out += unit;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string_view source = input.substr(0, split);
  const std::string content = split == std::string_view::npos ? "Bye" : message_content(input.substr(split + 1));
  ChatTemplateInputs in;
  in.messages = nlohmann::json::array({{{"role", "system"}, {"content", "Be brief."}},
                                       {{"role", "user"}, {"content", "Hi"}},
                                       {{"role", "assistant"}, {"content", "Hello!"}},
                                       {{"role", "user"}, {"content", content}}});
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.add_generation_prompt = size % 2 == 0;
  // A 32nd of the real budget: under ASan and the fuzzer's instrumentation a
  // render that spends 1 GiB takes 5-20 s, past scripts/fuzz.sh's -timeout=10
  // on a busy machine (the hostile_replace_chain seed did, with 128 MiB).
  in.max_work_bytes = 32 << 20;
  try {
    ChatTemplate::parse(source).apply(in);
  } catch (const Error&) {
  }
  return 0;
}

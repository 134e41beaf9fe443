#include "decode/generate.h"

#include <chrono>
#include <vector>

#include "core/error.h"

namespace kvserve {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GenerateResult generate(Decoder& decoder, Sampler& sampler, const Tokenizer& tokenizer,
                        std::span<const int32_t> prompt, const GenerateOptions& options,
                        const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) throw Error("the prompt is empty (no tokens to start from)");
  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<float> logits;

  auto t0 = std::chrono::steady_clock::now();
  std::span<const float> out = decoder.append(prompt);
  result.prompt_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  result.finish_reason = "length";
  const int64_t room = decoder.max_context() - decoder.length();
  const int64_t budget = std::min(options.max_new_tokens, room + 1);
  for (int64_t i = 0; i < budget; ++i) {
    logits.assign(out.begin(), out.end());
    const int32_t id = sampler.sample(logits, history);
    result.tokens.push_back(id);
    history.push_back(id);
    const bool keep_going = on_token(id);
    if (options.stop_at_end_of_generation && tokenizer.is_end_of_generation(id)) {
      result.finish_reason = "stop";
      break;
    }
    if (!keep_going) {
      result.finish_reason = "stop";
      break;
    }
    if (i + 1 < budget) out = decoder.append(std::span<const int32_t>(&id, 1));
  }
  result.generate_seconds = seconds_since(t0);
  return result;
}

}  // namespace kvserve

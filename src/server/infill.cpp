#include "server/infill.h"

#include <algorithm>

#include "core/error.h"

namespace kvserve::server {
namespace {

void append(std::vector<int32_t>& to, const std::vector<int32_t>& more) { to.insert(to.end(), more.begin(), more.end()); }

// Repository-level context: the project, then each extra file under its name.
std::vector<int32_t> extra_tokens(const Tokenizer& tokenizer, const InfillInput& input) {
  const FimTokens& fim = tokenizer.fim();
  std::vector<int32_t> out;
  if (fim.repo >= 0) {
    out.push_back(fim.repo);
    append(out, tokenizer.encode("myproject\n", false, false));  // llama-server's project name
  }
  for (const InfillInput::File& file : input.extra) {
    if (fim.file_sep >= 0) {
      out.push_back(fim.file_sep);
      append(out, tokenizer.encode(file.filename + "\n", false, false));
    } else {
      append(out, tokenizer.encode("\n\n--- snippet ---\n\n", false, false));
    }
    append(out, tokenizer.encode(file.text, false, false));
  }
  if (fim.file_sep >= 0) {
    out.push_back(fim.file_sep);
    append(out, tokenizer.encode("filename\n", false, false));  // the current file's name (llama-server's)
  }
  return out;
}

}  // namespace

std::vector<int32_t> infill_prompt(const Tokenizer& tokenizer, const InfillInput& input, int64_t n_batch,
                                   int64_t n_predict, int64_t n_ctx) {
  const FimTokens& fim = tokenizer.fim();
  if (!fim.supported())
    throw Error("fill-in-the-middle is not supported by this model: its vocabulary has no FIM prefix, suffix and "
                "middle tokens");
  std::vector<int32_t> prefix = tokenizer.encode(input.prefix, false, false);
  std::vector<int32_t> suffix = tokenizer.encode(input.suffix, false, false);
  const std::vector<int32_t> prompt = tokenizer.encode(input.prompt, false, true);
  const std::vector<int32_t> extra = extra_tokens(tokenizer, input);

  const auto prefix_take = std::min<int64_t>(static_cast<int64_t>(prefix.size()), 3 * (n_batch / 4));
  const auto suffix_take = std::min<int64_t>(
      static_cast<int64_t>(suffix.size()), std::max<int64_t>(0, n_batch / 4 - (2 + static_cast<int64_t>(prompt.size()))));
  const auto extra_take =
      std::min<int64_t>(std::max<int64_t>(0, n_ctx - n_batch - 2 * n_predict), static_cast<int64_t>(extra.size()));
  prefix.erase(prefix.begin(), prefix.end() - prefix_take);
  suffix.resize(static_cast<size_t>(suffix_take));

  std::vector<int32_t> out(extra.end() - extra_take, extra.end());
  if (tokenizer.add_bos() && tokenizer.bos_id() >= 0) out.push_back(tokenizer.bos_id());
  out.push_back(fim.prefix);
  append(out, prefix);
  append(out, prompt);
  out.push_back(fim.suffix);
  append(out, suffix);
  out.push_back(fim.middle);
  return out;
}

}  // namespace kvserve::server

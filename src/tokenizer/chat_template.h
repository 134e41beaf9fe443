#pragma once
// Chat templates: turns a list of chat messages into the prompt text a model
// was trained on, by interpreting the Jinja template stored in GGUF's
// tokenizer.chat_template.
//
// Only a subset of Jinja is interpreted, enough for the common Llama 3,
// Qwen / ChatML, Mistral and SmolLM templates: {{ }} output, {% if / elif /
// else %}, {% for x in xs [if cond] %} with loop.index / index0 / first /
// last / length, {% set x = ... %} (also namespace attributes), literals,
// arithmetic, comparisons, `in`, `is [not] defined|none|string|...`, `~` and
// `+` concatenation, subscripts and slices, the usual filters (trim, length,
// upper, lower, tojson, default, join, ...), string and dict methods, and
// raise_exception(). Whitespace follows Hugging Face's settings
// (trim_blocks and lstrip_blocks) plus the {%- -%} markers.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvserve {

class GGUFFile;
class Tokenizer;

struct ChatTemplateInputs {
  nlohmann::json messages = nlohmann::json::array();  // [{"role": ..., "content": ...}, ...]
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  // Hugging Face's `tools`: the request's list of {"type": "function",
  // "function": {...}} as given, or null (None) when it has none.
  nlohmann::json tools = nullptr;
  // More variables for the template (a request's chat_template_kwargs, such
  // as Qwen3's enable_thinking); the ones above win over any of the same name.
  nlohmann::json variables = nlohmann::json::object();
  // The work budget of this render in bytes touched; 0 is the default,
  // kMaxWorkBytes (chat_template_ast.h). Tests and the fuzzer lower it.
  size_t max_work_bytes = 0;
};

class ChatTemplate {
 public:
  // Throws kvserve::Error on syntax outside the supported subset.
  static ChatTemplate parse(std::string_view source);
  // <|im_start|>role\ncontent<|im_end|>\n per message, then the assistant header.
  static ChatTemplate chatml();
  // <start_of_turn>role\ncontent<end_of_turn>\n, the assistant as "model" (Gemma).
  static ChatTemplate gemma();
  // The file's tokenizer.chat_template, or Gemma's format (gemma* files) or
  // ChatML when it has none, or ChatML when the
  // template cannot be parsed; `note` (when given) says which and why.
  static ChatTemplate for_model(const GGUFFile& file, std::string* note = nullptr);

  // Throws kvserve::Error when the template raises (raise_exception) or
  // applies an operation to values of the wrong type.
  std::string apply(const ChatTemplateInputs& inputs) const;
  const std::string& source() const;

  struct Program;

 private:
  explicit ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;  // immutable, so copies share it and apply() is thread-safe
};

// The tokenizer's BOS and EOS pieces as the template's bos_token and
// eos_token ("" for a token it does not have).
void set_special_tokens(ChatTemplateInputs& inputs, const Tokenizer& tokenizer);

// A rendered prompt's tokens: with the tokenizer's BOS unless the template
// wrote bos_token at its start itself.
std::vector<int32_t> encode_rendered_prompt(const Tokenizer& tokenizer, const ChatTemplateInputs& inputs,
                                            const std::string& rendered);

}  // namespace kvserve

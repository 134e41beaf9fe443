// The Jinja-subset chat template interpreter on the template shapes real
// models ship (SmolLM / ChatML, Qwen, Llama 3, Mistral) and on the language
// features they use.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/gguf.h"
#include "tokenizer/chat_template.h"
#include "test_util.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

json conversation() {
  return json::array({{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", "Hi"}},
                      {{"role", "assistant"}, {"content", "Hello!"}},
                      {{"role", "user"}, {"content", "Bye"}}});
}

std::string render(const std::string& source, json messages, bool add_generation_prompt = true) {
  ChatTemplateInputs in;
  in.messages = std::move(messages);
  in.add_generation_prompt = add_generation_prompt;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  return ChatTemplate::parse(source).apply(in);
}

// The template SmolLM2-Instruct ships in its GGUF (and, but for the default
// system prompt, Qwen2's).
const char* const kSmolLm =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const char* const kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

const char* const kMistral =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}";

// The template Gemma 3's instruction-tuned files carry (Hugging Face's
// tokenizer_config.json of gemma-3-*-it): string or list-of-parts content.
const char* const kGemma3It =
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n";

}  // namespace

TEST(ChatTemplate, Gemma3InstructTemplate) {
  EXPECT_EQ(render(kGemma3It, conversation()),
            "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  const json parts = json::array({{{"role", "user"},
                                   {"content", json::array({{{"type", "text"}, {"text", " What is this? "}}})}}});
  EXPECT_EQ(render(kGemma3It, parts), "<s><start_of_turn>user\nWhat is this?<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_THROW(render(kGemma3It, json::array({{{"role", "assistant"}, {"content", "x"}}})), Error);
}

TEST(ChatTemplate, SmolLmAddsTheDefaultSystemPromptOnlyWithoutOne) {
  EXPECT_EQ(render(kSmolLm, json::array({{{"role", "user"}, {"content", "Hi"}}})),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(kSmolLm, conversation(), false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n");
}

TEST(ChatTemplate, Llama3TrimsContentAndPrependsBos) {
  const json messages = json::array({{{"role", "user"}, {"content", "  Hi \n"}}});
  EXPECT_EQ(render(kLlama3, messages),
            "<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, MistralAlternatesAndRaises) {
  const json ok = json::array({{{"role", "user"}, {"content", "Hi"}},
                               {{"role", "assistant"}, {"content", "Hello"}},
                               {{"role", "user"}, {"content", "Bye"}}});
  EXPECT_EQ(render(kMistral, ok), "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]");
  try {
    render(kMistral, conversation());
    FAIL() << "expected raise_exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate"), std::string::npos);
  }
}

TEST(ChatTemplate, ChatMlFallback) {
  ChatTemplateInputs in;
  in.messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(ChatTemplate::chatml().apply(in), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// Gemma files without a template (the base models) get Gemma's turn format:
// the system message joins the first user turn, the assistant is "model".
TEST(ChatTemplate, GemmaFallback) {
  ChatTemplateInputs in;
  in.messages = conversation();
  in.bos_token = "<bos>";
  EXPECT_EQ(ChatTemplate::gemma().apply(in),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  in.messages = json::array({{{"role", "user"}, {"content", " Hi \n"}}});
  EXPECT_EQ(ChatTemplate::gemma().apply(in), "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, WhitespaceControlAndBlockTrimming) {
  const std::string src =
      "{%- for m in messages %}\n"
      "    {%- if m.role == 'user' %}\n"
      "U:{{ m.content }}\n"
      "    {%- else %}\n"
      "A:{{ m.content }}\n"
      "    {%- endif %}\n"
      "{%- endfor %}\n";
  const json messages = json::array({{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}});
  EXPECT_EQ(render(src, messages), "U:aA:b");
  EXPECT_EQ(render("  {% if true %}\nx\n  {% endif %}\ny", json::array()), "x\ny");
}

TEST(ChatTemplate, ExpressionsFiltersTestsAndNamespaces) {
  const json none = json::array();
  EXPECT_EQ(render("{{ 1 + 2 * 3 }},{{ 7 // 2 }},{{ 7 % 3 }},{{ -2 }},{{ 1.5 }}", none), "7,3,1,-2,1.5");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ true }}|{{ 'x' if false else 'y' }}|{{ none }}", none), "a1True|y|None");
  EXPECT_EQ(render("{{ foo is defined }}{{ foo is not defined }}{{ 3 is odd }}{{ 'b' in 'abc' }}{{ 2 not in [1] }}", none),
            "FalseTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ ' Ab '|trim|upper }}{{ [1,2,3]|length }}{{ foo|default('d') }}{{ ['a','b']|join('-') }}", none),
            "AB3da-b");
  EXPECT_EQ(render("{{ {'k': [1, 'x']}|tojson }}{{ 'a,b'.split(',')[1] }}{{ 'Hello'.startswith('He') }}", none),
            "{\"k\": [1, \"x\"]}bTrue");  // Python's json.dumps spacing, as Hugging Face's tojson
  EXPECT_EQ(render("{{ messages[1:]|length }}{{ messages[-1].content }}{{ messages[::-1][0]['role'] }}", conversation()),
            "3Byeuser");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for m in messages if m.role == 'user' %}{% set ns.n = ns.n + 1 %}"
                   "{{ loop.index }}/{{ loop.length }}{% if not loop.last %},{% endif %}{% endfor %}={{ ns.n }}",
                   conversation()),
            "1/2,2/2=2");
  EXPECT_EQ(render("{% for k, v in {'a': 1}.items() %}{{ k }}{{ v }}{% else %}empty{% endfor %}"
                   "{% for x in [] %}x{% else %}empty{% endfor %}",
                   none),
            "a1empty");
  EXPECT_EQ(render("{# comment #}{% if 1 > 2 %}a{% elif 2 >= 2 and not false %}b{% else %}c{% endif %}", none), "b");
}

TEST(ChatTemplate, TojsonAndToolsAreHuggingFaces) {
  const json none = json::array();
  EXPECT_EQ(render("{{ {'a': {'b': [1, 2]}, 'e': [], 'o': {}}|tojson(2) }}", none),
            "{\n  \"a\": {\n    \"b\": [\n      1,\n      2\n    ]\n  },\n  \"e\": [],\n  \"o\": {}\n}");
  EXPECT_EQ(render("{{ [1, [2]]|tojson(0) }}|{{ 'caf\xc3\xa9'|tojson }}", none), "[\n1,\n[\n2\n]\n]|\"caf\xc3\xa9\"");
  // As Jinja's lexer: "}}" and "%}" close a tag only outside strings and brackets (Qwen2.5-Coder-1.5B's template).
  EXPECT_EQ(render("{{ \"{{\\\"a\\\": 1}}\" }}|{% if '%}' %}x{% endif %}|{{ {'o': {}}|length }}", none), "{{\"a\": 1}}|x|1");
  // `tools` is None without tools (defined, as Hugging Face passes it), else the list.
  const ChatTemplate t = ChatTemplate::parse(
      "{% if tools %}{% for t in tools %}{{ t.function.name }}{% endfor %}{% else %}none{% endif %}|{{ tools is defined }}");
  ChatTemplateInputs in;
  in.messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(t.apply(in), "none|True");
  in.tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(t.apply(in), "f|True");
}

TEST(ChatTemplate, RejectsSyntaxOutsideTheSubset) {
  for (const char* bad : {"{% macro m() %}{% endmacro %}", "{{ 1 + }}", "{% if x %}no end", "{{ 'open }}",
                          "{% endfor %}", "{% for x in y %}{% endif %}"})
    EXPECT_THROW(ChatTemplate::parse(bad), Error) << bad;
  EXPECT_THROW(render("{{ 'a' + 1 }}", json::array()), Error);
  EXPECT_THROW(render("{{ nothing.method() }}", json::array()), Error);
}

TEST(ChatTemplate, RealModelTemplateIsUsed) {
  const std::string path = kvserve::test_util::default_model_path();
  if (path.empty()) GTEST_SKIP() << "the real model has not been fetched";
  const GGUFFile file(path);
  std::string note;
  const ChatTemplate t = ChatTemplate::for_model(file, &note);
  EXPECT_EQ(note, "using the model's tokenizer.chat_template");
  ChatTemplateInputs in;
  in.messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(t.apply(in), render(kSmolLm, in.messages));
}

// The chat template interpreter's limits (chat_template_ast.h): a template is
// untrusted code from a model file, so every way one could exhaust the
// stack, memory or time ends in a kvserve::Error that says which limit.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/chat_template_ast.h"
#include "tiny_vocab.h"

using namespace kvserve;
using namespace kvserve::chat_template_detail;

namespace {

std::string render(const std::string& source, size_t max_work_bytes = 0) {
  ChatTemplateInputs in;
  in.messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  in.max_work_bytes = max_work_bytes;
  return ChatTemplate::parse(source).apply(in);
}

// The message of the kvserve::Error that parsing and rendering `source` throws.
std::string error_of(const std::string& source, size_t max_work_bytes = 0) {
  try {
    render(source, max_work_bytes);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string repeated(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

}  // namespace

// Found by fuzzing: std::stoll threw std::out_of_range out of ChatTemplate::parse.
TEST(ChatTemplateLimits, IntegerLiteralOutOfRange) {
  EXPECT_NE(error_of("{% if 1234567890123456789012345678901234567890 %}x{% endif %}").find("out of range"),
            std::string::npos);
  EXPECT_EQ(render("{{ 9223372036854775807 }}"), "9223372036854775807");
  EXPECT_NE(error_of("{{ 9223372036854775808 }}").find("out of range"), std::string::npos);
  EXPECT_NE(error_of("{{ 1" + std::string(400, '0') + ".5 }}").find("out of range"), std::string::npos);
  EXPECT_NE(error_of("{{ 1.2.3 }}").find("malformed number"), std::string::npos);
}

TEST(ChatTemplateLimits, IntegerArithmeticOverflow) {
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 4611686018427387904 * 2 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ -9223372036854775807 - 2 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ (-9223372036854775807 - 1) // -1 }}").find("integer overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ -(-9223372036854775807 - 1) }}").find("integer overflow"), std::string::npos);
  EXPECT_EQ(render("{{ (-9223372036854775807 - 1) % -1 }}"), "0");
  EXPECT_EQ(render("{{ -7 // 2 }},{{ -7 % 3 }},{{ 7 % -3 }}"), "-4,2,-2");  // Python's rounding
  EXPECT_NE(error_of("{{ range(9999999999.0 * 9999999999.0) }}").find("out of range"), std::string::npos);
  EXPECT_EQ(render("{{ 'abc'[::9223372036854775807] }}{{ 'abc'[::-9223372036854775807] }}"), "ac");
}

TEST(ChatTemplateLimits, NestingDepth) {
  EXPECT_NE(error_of(repeated("{% if true %}", 100) + repeated("{% endif %}", 100)).find("blocks nest more than 64"),
            std::string::npos);
  EXPECT_EQ(render(repeated("{% if true %}", 60) + "x" + repeated("{% endif %}", 60)), "x");
  EXPECT_NE(error_of("{{ " + repeated("(", 100000) + "1" + repeated(")", 100000) + " }}").find("nest more than"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + repeated("not ", 100000) + "1 }}").find("nest more than"), std::string::npos);
  EXPECT_NE(error_of("{{ " + repeated("-", 100000) + "1 }}").find("nest more than"), std::string::npos);
  // A flat chain grows the tree as deep as nesting would.
  EXPECT_NE(error_of("{{ 1" + repeated(" + 1", 100000) + " }}").find("operations deep"), std::string::npos);
  EXPECT_NE(error_of("{{ x" + repeated("|trim", 100000) + " }}").find("operations deep"), std::string::npos);
  EXPECT_EQ(render("{{ 1" + repeated(" + 1", 100) + " }}"), "101");
}

TEST(ChatTemplateLimits, NestedValues) {
  EXPECT_NE(error_of("{% set ns = namespace(x=1) %}{% for i in range(100) %}{% set ns.x = [ns.x] %}{% endfor %}")
                .find("nests lists or dicts more than 64"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=1) %}{% for i in range(100) %}{% set ns.x = ns %}{% endfor %}")
                .find("nests lists or dicts"),
            std::string::npos);
}

TEST(ChatTemplateLimits, LoopIterations) {
  EXPECT_NE(error_of("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}")
                .find("loops ran more than 1048576 iterations"),
            std::string::npos);
  EXPECT_NE(error_of("{{ range(10000000)|length }}").find("range() of more than"), std::string::npos);
  EXPECT_NE(error_of("{{ range(-9223372036854775807, 9223372036854775807) }}").find("range() of more than"),
            std::string::npos);
  EXPECT_EQ(render("{% for i in range(1000) %}{% endfor %}{{ range(3)|join(',') }}"), "0,1,2");
}

TEST(ChatTemplateLimits, OutputAndStringSize) {
  EXPECT_NE(error_of("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}").find("output would exceed 64 MiB"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'ab' * 9223372036854775807 }}").find("string repetition would make"), std::string::npos);
  EXPECT_EQ(render("{{ 'ab' * 3 }}{{ 2 * 'c' }}{{ 'x' * -1 }}"), "abababcc");
  EXPECT_NE(error_of("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}")
                .find("more than 64 MiB"),
            std::string::npos);
  EXPECT_NE(error_of("{% set s = 'x' * 1000000 %}{{ s.replace('x', s) }}").find("replace() would make"),
            std::string::npos);
  EXPECT_NE(error_of("{{ [1]|tojson(1000000000) }}").find("indent must be at most"), std::string::npos);
}

TEST(ChatTemplateLimits, WorkBudget) {
  // Up to 1M iterations each copying a 32 KiB string: 32 GiB of copies.
  EXPECT_NE(error_of("{% set s = 'x' * 32768 %}{% for i in range(1000000) %}{% set t = s %}{% endfor %}")
                .find("touched more than 1 GiB of values"),
            std::string::npos);
}

// The templates issue 31 measured at over 50 s each, and others of their kind:
// string operations on strings of tens of MiB. Each now ends within about a
// second: it renders, or fails naming the limit. Templates that spend the
// whole budget run with a smaller one here (1 GiB takes ~1 s in a Release
// build, ~5 s under ASan); the charges are the same.
TEST(ChatTemplateLimits, HostileStringTemplatesEndFast) {
  constexpr size_t kBudget = 256 << 20;
  // 224 MiB of copies, then a search charged 8 units a byte: fails before it searches.
  EXPECT_NE(error_of("{% set a = 'a' * 33554432 %}{{ (a ~ 'b') in (a ~ a) }}", kBudget)
                .find("touched more than 256 MiB of values"),
            std::string::npos);
  // A string is counted against the loop limit before a string per character is made.
  EXPECT_NE(error_of("{% for c in 'x' * 67108864 %}{% endfor %}").find("loops ran more than 1048576 iterations"),
            std::string::npos);
  EXPECT_NE(error_of("{% for c in 'x' * 67108864 if c == 'y' %}{% endfor %}").find("loops ran more than"),
            std::string::npos);
  // 2, 3, 5, 9, 17 MiB with 1, 2, 4, 8, 16 M matches (32 units each).
  EXPECT_NE(error_of("{% set s = 'ab' * 1000000 %}{{ s" + repeated(".replace('a', 'aa')", 10) + " }}", kBudget)
                .find("touched more than 256 MiB"),
            std::string::npos);
  EXPECT_NE(error_of("{% set a = 'x' * 67108864 %}{{ a ~ 'y' }}").find("'~' would make a string of more than 64 MiB"),
            std::string::npos);
  EXPECT_NE(error_of("{{ ('x' * 33554432)|join('--') }}").find("join would make"), std::string::npos);
  EXPECT_EQ(render("{{ ('x' * 1000000)|join(',')|length }}"), "1999999");
  // Linear search: 'a'*N ~ 'b' in 'a'*2N is a few passes (std::string::find: N*N/2 comparisons).
  EXPECT_EQ(render("{% set a = 'a' * 4000000 %}{{ (a ~ 'b') in (a ~ a) }}{{ (a ~ 'b') in (a ~ 'b') }}"), "FalseTrue");
}

TEST(ChatTemplateLimits, StringOperationsChargeTheWorkBudget) {
  constexpr size_t kBudget = 64 << 20;
  const char* const kOverBudget = "touched more than 64 MiB of values";
  // A search is charged 8 units a byte (its worst case), though this one is fast.
  EXPECT_NE(error_of("{% set s = 'a' * 4000000 %}{% for i in range(10) %}{{ 'ab' in s }}{% endfor %}", kBudget)
                .find(kOverBudget),
            std::string::npos);
  // Pieces are charged as they are made.
  for (const char* operation : {"s.split(' ')", "s.split()", "s.replace(' ', '')", "s.split('ab')", "s.title()"})
    EXPECT_NE(error_of(std::string("{% set s = ('x' * 10 ~ ' ') * 100000 %}{% for i in range(1000) %}{% set t = ") +
                           operation + " %}{% endfor %}",
                       kBudget)
                  .find(kOverBudget),
              std::string::npos)
        << operation;
  EXPECT_NE(error_of("{% set l = ('a,' * 100000).split(',') %}{% for i in range(1000) %}{% set t = l|tojson %}{% endfor %}",
                     kBudget)
                .find(kOverBudget),
            std::string::npos);
  // Found by fuzzing: a long string's tojson was charged one step, so 1000 dumps of 16 MiB ran for minutes.
  EXPECT_NE(error_of("{% set s = 'a ' * 8000000 %}{% for i in range(1000) %}{% set t = s|tojson %}{% endfor %}", kBudget)
                .find(kOverBudget),
            std::string::npos);
  EXPECT_NE(error_of("{% set d = {('k' * 8000000): 1} %}{% for i in range(1000) %}{% set t = d|tojson %}{% endfor %}",
                     kBudget)
                .find(kOverBudget),
            std::string::npos);
  // Cheap steps count too: a loop body of many nodes cannot run 2^20 times.
  EXPECT_NE(error_of("{% for i in range(1000000) %}" + repeated("{% if i %}{% endif %}", 50) + "{% endfor %}", kBudget)
                .find(kOverBudget),
            std::string::npos);
  // The default budget is larger: 200 K pieces (~67 MiB) fit.
  EXPECT_EQ(render("{% set s = 'x' * 1000 %}{% for i in range(200) %}{% set t = s.split('x') %}{% endfor %}"), "");
}

TEST(ChatTemplateLimits, PrintedValuesAreMeasuredBeforeTheyAreWritten) {
  // A control byte prints as \u0001 in JSON: 6 bytes each, over 64 MiB.
  EXPECT_NE(error_of("{% set s = '\x01' * 20000000 %}{{ s|tojson }}").find("printing a value would make"),
            std::string::npos);
  EXPECT_NE(error_of("{% set s = '\x01' * 20000000 %}{{ [s] ~ '' }}").find("would make a string of more than"),
            std::string::npos);
  EXPECT_EQ(render("{{ '\x01\n\"'|tojson }}"), "\"\\u0001\\n\\\"\"");
  // raise_exception's message becomes the response: it is cut.
  const std::string message = error_of("{{ raise_exception('x' * 10000000) }}");
  EXPECT_LT(message.size(), kMaxErrorBytes + 100);
  EXPECT_NE(message.find("xxxx"), std::string::npos);
}

TEST(ChatTemplateLimits, StandardLibraryErrorsBecomeTemplateErrors) {
  // Found by fuzz_chat_template: strftime_now() read its format from a freed temporary.
  EXPECT_EQ(render("{{ strftime_now('x%%y') }}"), "x%y");
  for (const char* source : {"{{ strftime_now() }}", "{{ [1, 2].items() }}", "{{ 5|join }}", "{{ 'x'|items }}",
                             "{{ '99999999999999999999999'|int }}", "{{ (9999999999.0 * 9999999999.0)|int }}"})
    EXPECT_NE(error_of(source), "(no error)") << source;
  EXPECT_EQ(render("{{ 'abc'|join('-') }}"), "a-b-c");
  // Found by the replace() limit test: replace() and endswith() kept references into temporaries.
  EXPECT_EQ(render("{{ 'ab'.replace('a', 'xyz') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.endswith('ab') }}"), "xyzbTrueFalse");
  EXPECT_EQ(render("{{ ['\xff']|tojson }}"), "[\"\xEF\xBF\xBD\"]");  // invalid UTF-8 is replaced, not thrown
}

// A model file whose template breaks a limit still loads: it falls back to ChatML and says why.
TEST(ChatTemplateLimits, ModelWithBadTemplateFallsBackToChatMl) {
  GGUFWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.chat_template", "{% if 1234567890123456789012345678901234567890 %}x{% endif %}");
  const test_util::MemoryFile file(w.serialize());
  const GGUFFile gguf(file.path());
  std::string note;
  const ChatTemplate t = ChatTemplate::for_model(gguf, &note);
  EXPECT_NE(note.find("is not supported"), std::string::npos) << note;
  EXPECT_NE(note.find("using ChatML"), std::string::npos) << note;
  ChatTemplateInputs in;
  in.messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(t.apply(in), ChatTemplate::chatml().apply(in));
}

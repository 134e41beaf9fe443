// The kvserve binary on bad input: exit code 1 and one line saying what is wrong.
#include <gtest/gtest.h>

#include <algorithm>

#include "test_util.h"

using ::kvserve::test_util::run_kvserve;
using ::kvserve::test_util::TempFile;

namespace {

void expect_one_line_error(const std::string& args, const std::string& needle) {
  const auto r = run_kvserve(args);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
}

}  // namespace

TEST(Cli, RunOnAMissingModelFails) {
  expect_one_line_error("run -m /nonexistent/model.gguf -n 1", "/nonexistent/model.gguf: cannot open");
}

TEST(Cli, RunOnACorruptModelFails) {
  TempFile f(".gguf");
  f.write({'G', 'G', 'U', 'F', 3, 0, 0, 0, 1, 2});
  expect_one_line_error("run -m " + f.path() + " -n 1", f.path() + ": unexpected end of file while reading tensor_count");
  TempFile g(".gguf");
  g.write({'n', 'o', 't', ' ', 'a', ' ', 'm', 'o', 'd', 'e', 'l'});
  expect_one_line_error("info " + g.path(), "bad magic");
}

TEST(Cli, RunRejectsBadFlags) {
  expect_one_line_error("run -m /nonexistent.gguf --top-p 3", "top_p");
}

// --kv-type reaches the engine of `run -f` and `bench --serving`; a block type
// on a model whose head size is not whole 32-element blocks is refused.
TEST(Cli, EngineFrontEndsTakeTheKVType) {
  TempFile model(".gguf"), small(".gguf"), prompts(".txt");
  ::kvserve::test_util::write_synth_model(model.path(), "tiny-hd32");
  ::kvserve::test_util::write_synth_model(small.path(), "tiny-llama");
  const std::string text = "the cat\nsat on\n";
  prompts.write(std::vector<uint8_t>(text.begin(), text.end()));
  const auto run = run_kvserve("run -m " + model.path() + " -f " + prompts.path() + " --parallel 2 -n 4 --kv-type q8_0");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const auto bench = run_kvserve("bench --serving -m " + model.path() +
                                 " --requests 3 --concurrency 2 -p 16 -n 4 -t 1 --kv-type q8_0 --kv-mem 1");
  EXPECT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_NE(bench.output.find("KV q8_0: 272 bytes/token"), std::string::npos) << bench.output;
  expect_one_line_error("run -m " + small.path() + " -f " + prompts.path() + " -n 2 --kv-type q8_0", "head size is 16");
}

// `run -f --spec draft` drafts with a model inside the engine (the same greedy
// text as without); a draft with another vocabulary, or `serve --spec draft`
// without --draft, is a one-line error.
TEST(Cli, EngineFrontEndsTakeADraftModel) {
  TempFile model(".gguf"), qwen(".gguf"), prompts(".txt");
  ::kvserve::test_util::write_synth_model(model.path(), "tiny-llama");
  ::kvserve::test_util::write_synth_model(qwen.path(), "tiny-qwen2");
  const std::string text = "the cat\nsat on\n";
  prompts.write(std::vector<uint8_t>(text.begin(), text.end()));
  const std::string run = "run -m " + model.path() + " -f " + prompts.path() + " --parallel 2 -n 12 --temp 0 --ignore-eos";
  const auto plain = run_kvserve(run);
  const auto spec = run_kvserve(run + " --spec draft --draft " + model.path() + " --draft-k 3");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(spec.exit_code, 0) << spec.output;
  EXPECT_NE(spec.output.find("speculative: draft, k 3"), std::string::npos) << spec.output;
  EXPECT_EQ(spec.output.substr(0, spec.output.find("2 prompts")), plain.output.substr(0, plain.output.find("2 prompts")));
  // A draft head over the first 100 ids only: the same text.
  const auto narrow = run_kvserve(run + " --spec draft --draft " + model.path() + " --draft-k 3 --draft-vocab 100");
  ASSERT_EQ(narrow.exit_code, 0) << narrow.output;
  EXPECT_EQ(narrow.output.substr(0, narrow.output.find("2 prompts")), plain.output.substr(0, plain.output.find("2 prompts")));
  const auto negative = run_kvserve(run + " --spec draft --draft-vocab -5");
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_NE(negative.output.find("--draft-vocab: Value -5 not in range"), std::string::npos) << negative.output;
  expect_one_line_error(run + " --spec draft --draft " + qwen.path(), "vocabulary of 384 tokens");
  expect_one_line_error("serve -m " + model.path() + " --port 0 --spec draft", "needs a draft model");
  expect_one_line_error("serve -m " + model.path() + " --port 0 --draft " + qwen.path(), "vocabulary of 384 tokens");
}

// --activations sets the precision of the quantized matmuls (reported by run
// and bench --serving); an unknown name is refused with the names that work.
TEST(Cli, ActivationsFlagChoosesTheMatmulPrecision) {
  TempFile model(".gguf");
  ::kvserve::test_util::write_synth_model(model.path(), "tiny-llama");
  const auto plain = run_kvserve("run -m " + model.path() + " -p hello -n 3");
  const auto exact = run_kvserve("run -m " + model.path() + " -p hello -n 3 --activations f32");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(exact.exit_code, 0) << exact.output;
  EXPECT_NE(plain.output.find("activations: q8"), std::string::npos) << plain.output;  // the default
  EXPECT_NE(exact.output.find("activations: f32"), std::string::npos) << exact.output;
  const auto bench = run_kvserve("bench --serving -m " + model.path() +
                                 " --requests 2 --concurrency 2 -p 8 -n 2 -t 1 --activations q8");
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_NE(bench.output.find("activations q8"), std::string::npos) << bench.output;
  const auto bad = run_kvserve("run -m " + model.path() + " -n 1 --activations q4");  // CLI11's usage error
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--activations: q4 not in {f32,q8}"), std::string::npos) << bad.output;
}

namespace {
// "prompt: N tokens" (run -p) or -1.
long prompt_tokens(const std::string& output) {
  const size_t at = output.find("prompt: ");
  return at == std::string::npos ? -1 : std::stol(output.substr(at + 8));
}
}  // namespace

// --chat sends each prompt as one user turn through the model's chat template
// (ChatML for a file without one, said on stderr), in run -p and run -f alike.
TEST(Cli, RunChatSendsThePromptThroughTheChatTemplate) {
  TempFile model(".gguf"), prompts(".txt");
  ::kvserve::test_util::write_synth_model(model.path(), "tiny-llama");
  const std::string text = "the cat\n";
  prompts.write(std::vector<uint8_t>(text.begin(), text.end()));
  const auto raw = run_kvserve("run -m " + model.path() + " -p cat -n 2 --temp 0");
  const auto chat = run_kvserve("run -m " + model.path() + " -p cat -n 2 --temp 0 --chat");
  ASSERT_EQ(raw.exit_code, 0) << raw.output;
  ASSERT_EQ(chat.exit_code, 0) << chat.output;
  EXPECT_NE(chat.output.find("chat template: the model has no tokenizer.chat_template; using ChatML"), std::string::npos)
      << chat.output;
  EXPECT_GT(prompt_tokens(chat.output), prompt_tokens(raw.output) + 4) << raw.output << chat.output;
  const auto file = run_kvserve("run -m " + model.path() + " -f " + prompts.path() + " -n 2 --temp 0 --chat");
  ASSERT_EQ(file.exit_code, 0) << file.output;
  EXPECT_NE(file.output.find("chat template:"), std::string::npos) << file.output;
}

// `bench -d` (llama-bench's depth): each test after that many tokens of
// context, named as llama-bench names it, with the K/V bytes it reads (per
// second of the step and per second in attention); a depth
// past the model's context is a one-line error.
TEST(Cli, BenchMeasuresAtADepth) {
  TempFile model(".gguf");
  ::kvserve::test_util::write_synth_model(model.path(), "tiny-llama");  // context 256
  const auto r = run_kvserve("bench -m " + model.path() + " -p 8 -n 4 -d 0 100 -r 1 -t 1 --kv-type f16 -o csv");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* test : {",pp8,", ",tg4,", ",pp8 @ d100,", ",tg4 @ d100,"})
    EXPECT_NE(r.output.find(test), std::string::npos) << test << "\n" << r.output;
  EXPECT_NE(r.output.find("kv_gb_per_s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("attention_kv_gb_per_s"), std::string::npos) << r.output;
  expect_one_line_error("bench -m " + model.path() + " -p 8 -n 0 -d 250 -r 1", "pp8 @ d250 needs 258 tokens of context");
}

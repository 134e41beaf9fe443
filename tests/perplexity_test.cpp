// `kvserve perplexity` end to end on the real stories260K model (head size 8):
// a finite perplexity with the plain KV types, a clear error for block types.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "test_util.h"

using ::kvserve::test_util::CommandResult;
using ::kvserve::test_util::run_kvserve;

namespace {

std::string stories_model() {
  const std::string p = kvserve::test_util::model_dir() + "/stories260k.gguf";
  return std::filesystem::exists(p) ? p : "";
}

std::string text_file() { return std::string(KVSERVE_SOURCE_DIR) + "/tests/data/pride_and_prejudice_ch1-3.txt"; }

// The mean KL divergence a --kl-divergence run printed against `base` ("exact f32 activations", "kv f16"), or -1
// when the line is missing.
double mean_kl(const CommandResult& r, const std::string& base) {
  const std::string label = "KL divergence from " + base + ": mean ";
  const size_t at = r.output.find(label);
  return at == std::string::npos ? -1.0 : std::stod(r.output.substr(at + label.size()));
}

}  // namespace

TEST(Perplexity, Stories260kGivesAFiniteNumber) {
  const std::string model = stories_model();
  if (model.empty()) GTEST_SKIP() << "models/stories260k.gguf not found";
  for (const char* type : {"f32", "f16", "bf16"}) {
    const CommandResult r =
        run_kvserve("perplexity -m " + model + " -f " + text_file() + " --ctx 128 --chunks 2 --kv-type " + type);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const size_t at = r.output.find("PPL = ");
    ASSERT_NE(at, std::string::npos) << r.output;
    const double ppl = std::stod(r.output.substr(at + 6));
    EXPECT_TRUE(std::isfinite(ppl)) << r.output;
    EXPECT_GT(ppl, 1.0) << r.output;
    EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
  }
}

TEST(Perplexity, RejectsBadInput) {
  const std::string model = stories_model();
  if (model.empty()) GTEST_SKIP() << "models/stories260k.gguf not found";
  const CommandResult q8 = run_kvserve("perplexity -m " + model + " -f " + text_file() + " --kv-type q8_0");
  EXPECT_EQ(q8.exit_code, 1);
  EXPECT_NE(q8.output.find("head size is 8"), std::string::npos) << q8.output;
  const CommandResult unknown = run_kvserve("perplexity -m " + model + " -f " + text_file() + " --kv-type int3");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.output.find("--kv-type"), std::string::npos) << unknown.output;
  const CommandResult missing = run_kvserve("perplexity -m " + model + " -f /nonexistent.txt");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("cannot open"), std::string::npos) << missing.output;
}

// --kl-divergence against exact activations: a small positive divergence for the default 8-bit activations on a
// quantized model, none at all when this run's activations are the exact ones too.
TEST(Perplexity, KlDivergenceFromExactActivations) {
  const std::string model = kvserve::test_util::model_dir() + "/smollm2-135m-instruct-q4_1.gguf";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << model << " not found";
  // Two loads of a 135M model and its exact passes: minutes without optimization (the Release suite runs it).
  if (kvserve::test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  const std::string command = "perplexity -m " + model + " -f " + text_file() + " --ctx 64 --chunks 2 --kl-divergence";
  const auto exact_kl = [](const CommandResult& r) { return mean_kl(r, "exact f32 activations"); };
  const CommandResult q8 = run_kvserve(command + " --activations q8");
  ASSERT_EQ(q8.exit_code, 0) << q8.output;
  EXPECT_GT(exact_kl(q8), 0.0) << q8.output;
  EXPECT_LT(exact_kl(q8), 0.05) << q8.output;
  EXPECT_NE(q8.output.find("same top token"), std::string::npos) << q8.output;
  const CommandResult exact = run_kvserve(command + " --activations f32");
  ASSERT_EQ(exact.exit_code, 0) << exact.output;
  EXPECT_EQ(exact_kl(exact), 0.0) << exact.output;
  EXPECT_NE(exact.output.find("(+0.000% +/- 0.000%)"), std::string::npos) << exact.output;
}

// --kl-base-kv-type: the base is this run's activations over another KV type, so the divergence is the KV
// type's alone: none for the same type, a small one for q8_0 against f16; an unknown type is refused.
TEST(Perplexity, KlDivergenceFromAnotherKvType) {
  const std::string model = kvserve::test_util::model_dir() + "/smollm2-135m-instruct-q4_1.gguf";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << model << " not found";
  if (kvserve::test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  const std::string command = "perplexity -m " + model + " -f " + text_file() + " --ctx 64 --chunks 2";
  const auto f16_kl = [](const CommandResult& r) { return mean_kl(r, "kv f16"); };
  const CommandResult same = run_kvserve(command + " --kv-type f16 --kl-base-kv-type f16");
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(f16_kl(same), 0.0) << same.output;
  const CommandResult q8 = run_kvserve(command + " --kv-type q8_0 --kl-base-kv-type f16");
  ASSERT_EQ(q8.exit_code, 0) << q8.output;
  EXPECT_GT(f16_kl(q8), 0.0) << q8.output;
  EXPECT_LT(f16_kl(q8), 0.05) << q8.output;
  const CommandResult unknown = run_kvserve(command + " --kl-base-kv-type int3");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.output.find("--kl-base-kv-type"), std::string::npos) << unknown.output;
}

// `kvserve perplexity -m MODEL -f FILE [--ctx 512] [--kv-type T] [--chunks N]`:
// perplexity of a model on a text, llama.cpp style. The text is tokenized
// once and cut into non-overlapping windows of --ctx tokens; each window is
// evaluated from an empty cache (its first token replaced by BOS when the
// vocabulary adds one), and only the second half of each window is scored:
// the predictions of tokens ctx/2+1 .. ctx-1 from the logits at ctx/2 ..
// ctx-2, so every scored token sees at least ctx/2 tokens of context.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/activations_flag.h"
#include "apps/rope_flags.h"
#include "apps/commands.h"
#include "core/error.h"
#include "decode/decoder.h"
#include "kernels/kv_quant.h"
#include "kv/kv_planner.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace kvserve::cli {
namespace {

struct PerplexityOptions {
  RopeFlags rope;
  std::string model = "models/smollm2-135m-instruct-q4_1.gguf";
  std::string file;
  int64_t context = 512;
  std::string kv_type = "f16";
  int64_t chunks = 0;  // 0: every whole window in the file
  int threads = 0;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open text file '" + path + "' (check -f)");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// -log p(target) from one row of logits, computed stably (max subtracted).
double negative_log_likelihood(std::span<const float> logits, int32_t target) {
  float max = logits[0];
  for (float x : logits) max = std::max(max, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - max));
  return std::log(sum) - static_cast<double>(logits[static_cast<size_t>(target)] - max);
}

// Running sums of the scored tokens' negative log-likelihoods.
struct NllStats {
  double sum = 0, sum_sq = 0;
  int64_t count = 0;
  void add(double nll) {
    sum += nll;
    sum_sq += nll * nll;
    ++count;
  }
  double mean() const { return sum / static_cast<double>(count); }
  // Standard error of the mean NLL; PPL's error is PPL times it (first order).
  double standard_error() const {
    if (count < 2) return 0;
    const double var = (sum_sq / static_cast<double>(count) - mean() * mean()) * static_cast<double>(count) /
                       static_cast<double>(count - 1);
    return std::sqrt(std::max(var, 0.0) / static_cast<double>(count));
  }
};

// K and V of every layer and KV head, as the cache stores them.
int64_t kv_bytes_per_token(const ModelConfig& c, KVType type) {
  return 2 * c.n_layers * c.n_kv_heads * static_cast<int64_t>(kv_head_bytes(type, c.head_dim));
}

void score_window(Decoder& decoder, std::vector<int32_t> window, int32_t bos, int64_t vocab, NllStats& stats) {
  if (bos >= 0) window[0] = bos;
  decoder.reset();
  const std::span<const float> logits = decoder.append_all(window);
  const auto n = static_cast<int64_t>(window.size());
  for (int64_t i = n / 2; i + 1 < n; ++i)
    stats.add(negative_log_likelihood(logits.subspan(static_cast<size_t>(i * vocab), static_cast<size_t>(vocab)),
                                      window[static_cast<size_t>(i + 1)]));
}

void run_perplexity(const PerplexityOptions& opt) {
  if (opt.threads < 0) throw Error("--threads must be >= 0, got " + std::to_string(opt.threads));
  if (opt.threads > 0) omp_set_num_threads(opt.threads);
  if (opt.context < 4) throw Error("--ctx must be at least 4, got " + std::to_string(opt.context));
  if (opt.chunks < 0) throw Error("--chunks must be >= 0 (0: all), got " + std::to_string(opt.chunks));
  const KVType kv_type = parse_kv_type(opt.kv_type, "--kv-type");
  const std::string text = read_text(opt.file);
  auto model = Model::load(opt.model, opt.rope.apply({}));
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  const std::vector<int32_t> tokens = tokenizer.encode(text, false, false);
  const int64_t ctx = opt.context, vocab = model->config().vocab_size;
  int64_t windows = static_cast<int64_t>(tokens.size()) / ctx;
  if (windows == 0)
    throw Error("'" + opt.file + "' has " + std::to_string(tokens.size()) + " tokens, fewer than one window of --ctx " +
                std::to_string(ctx) + "; lower --ctx or use a longer text");
  if (opt.chunks > 0) windows = std::min(windows, opt.chunks);
  auto decoder = make_decoder("cached", *model, ctx, kv_type);
  const int32_t bos = tokenizer.add_bos() ? tokenizer.bos_id() : -1;

  std::fprintf(stderr, "perplexity: %s | %zu tokens | %lld windows of %lld | kv %s | threads %d\n",
               model->config().name.c_str(), tokens.size(), static_cast<long long>(windows),
               static_cast<long long>(ctx), kv_type_info(kv_type).name, omp_get_max_threads());
  NllStats stats;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    const auto first = tokens.begin() + w * ctx;
    score_window(*decoder, std::vector<int32_t>(first, first + ctx), bos, vocab, stats);
    std::fprintf(stderr, "[%lld] %.4f\n", static_cast<long long>(w + 1), std::exp(stats.mean()));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double ppl = std::exp(stats.mean());
  std::printf("PPL = %.4f +/- %.4f (%lld scored tokens, kv %s, %lld bytes/token of KV cache)\n", ppl,
              ppl * stats.standard_error(), static_cast<long long>(stats.count), kv_type_info(kv_type).name,
              static_cast<long long>(kv_bytes_per_token(model->config(), kv_type)));
  std::printf("evaluated %lld tokens in %.2f s: %.1f tokens/s\n", static_cast<long long>(windows * ctx), seconds,
              static_cast<double>(windows * ctx) / std::max(seconds, 1e-9));
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto opt = std::make_shared<PerplexityOptions>();
  auto* cmd = app.add_subcommand("perplexity", "Perplexity of a model on a text file (second half of each window)");
  add_activations_flag(cmd);
  opt->rope.add_to(cmd);
  cmd->add_option("-m,--model", opt->model, "GGUF model file")->capture_default_str();
  cmd->add_option("-f,--file", opt->file, "Text file to score")->required();
  cmd->add_option("-c,--ctx", opt->context, "Tokens per window")->capture_default_str();
  cmd->add_option("--kv-type", opt->kv_type, "KV cache element type: f32, f16, bf16, q8_0, fp8, q4_0")
      ->capture_default_str();
  cmd->add_option("--chunks", opt->chunks, "Windows to score (0: all)")->capture_default_str();
  cmd->add_option("-t,--threads", opt->threads, "Threads (0: all cores)")->capture_default_str();
  cmd->callback([opt] { run_perplexity(*opt); });
}

}  // namespace kvserve::cli

// `kvserve perplexity -m MODEL -f FILE [--ctx 512] [--kv-type T] [--chunks N]`:
// perplexity of a model on a text, llama.cpp style. The text is tokenized
// once and cut into non-overlapping windows of --ctx tokens; each window is
// evaluated from an empty cache (its first token replaced by BOS when the
// vocabulary adds one), and only the second half of each window is scored:
// the predictions of tokens ctx/2+1 .. ctx-1 from the logits at ctx/2 ..
// ctx-2, so every scored token sees at least ctx/2 tokens of context.
// --kl-divergence also runs a second copy of the model with exact f32
// activations and compares the two distributions at every scored position
// (llama-perplexity's --kl-divergence, with the base computed in the same
// run): a far less noisy measure of what 8-bit activations cost than the
// difference of two perplexities on a few thousand tokens. --kl-base-kv-type T
// makes the base this run's activations over a KV cache of type T instead:
// what a KV type costs (q8_0 against f16, say) by the same measure.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <span>
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
  bool kl_divergence = false;
  std::string kl_base_kv_type;  // empty: the base has exact activations and this run's KV type
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open text file '" + path + "' (check -f)");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// log(sum exp(x)) of one row of logits, computed stably (max subtracted), in double.
double log_sum_exp(std::span<const float> logits) {
  float max = logits[0];
  for (float x : logits) max = std::max(max, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - max));
  return static_cast<double>(max) + std::log(sum);
}

// -log p(target) from one row of logits and its log_sum_exp.
double negative_log_likelihood(std::span<const float> logits, double log_sum, int32_t target) {
  return log_sum - static_cast<double>(logits[static_cast<size_t>(target)]);
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

// Mean KL(base || test), top-1 agreement and the paired difference of the two
// negative log-likelihoods over the scored positions.
struct DivergenceStats {
  double kl_sum = 0;
  double kl_max = 0;
  int64_t same_top = 0, count = 0;
  NllStats nll_change;  // test's NLL - base's, per token: its mean's standard error is the PPL change's
  // One position's two rows with their log_sum_exp and NLLs (computed once by the caller).
  void add(std::span<const float> base, double base_norm, double base_nll, std::span<const float> test,
           double test_norm, double test_nll) {
    const double kl = kl_divergence(base, base_norm, test, test_norm);
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
    same_top += argmax(base) == argmax(test) ? 1 : 0;
    ++count;
    nll_change.add(test_nll - base_nll);
  }
  static size_t argmax(std::span<const float> x) {
    return static_cast<size_t>(std::max_element(x.begin(), x.end()) - x.begin());
  }
  // sum p (log p - log q), p and q the softmaxes of the two rows (in double).
  static double kl_divergence(std::span<const float> p_logits, double p_norm, std::span<const float> q_logits,
                              double q_norm) {
    double kl = 0;
    for (size_t i = 0; i < p_logits.size(); ++i) {
      const double log_p = static_cast<double>(p_logits[i]) - p_norm;
      const double log_q = static_cast<double>(q_logits[i]) - q_norm;
      kl += std::exp(log_p) * (log_p - log_q);
    }
    return std::max(kl, 0.0);
  }
};

// K and V of every layer and KV head, as the cache stores them.
int64_t kv_bytes_per_token(const ModelConfig& c, KVType type) {
  return 2 * c.n_layers * c.n_kv_heads * static_cast<int64_t>(kv_head_bytes(type, c.head_dim));
}

// The window as the model sees it: the first token replaced by BOS where the vocabulary adds one.
std::vector<int32_t> window_at(const std::vector<int32_t>& tokens, int64_t w, int64_t ctx, int32_t bos) {
  const auto first = tokens.begin() + w * ctx;
  std::vector<int32_t> window(first, first + ctx);
  if (bos >= 0) window[0] = bos;
  return window;
}

// Logits at every position of the window, from an empty cache.
std::span<const float> window_logits(Decoder& decoder, const std::vector<int32_t>& window) {
  decoder.reset();
  return decoder.append_all(window);
}

std::span<const float> logits_row(std::span<const float> logits, int64_t i, int64_t vocab) {
  return logits.subspan(static_cast<size_t>(i * vocab), static_cast<size_t>(vocab));
}

void score_window(std::span<const float> logits, const std::vector<int32_t>& window, int64_t vocab, NllStats& stats) {
  const auto n = static_cast<int64_t>(window.size());
  for (int64_t i = n / 2; i + 1 < n; ++i) {
    const std::span<const float> row = logits_row(logits, i, vocab);
    stats.add(negative_log_likelihood(row, log_sum_exp(row), window[static_cast<size_t>(i + 1)]));
  }
}

// The --kl-divergence base: the same model file with exact f32 activations, or
// (--kl-base-kv-type) this run's model over another KV type.
struct DivergenceBase {
  std::string what;  // "exact f32 activations" or "kv f16"
  std::unique_ptr<Model> model;  // the exact-activations copy; none when the base shares this run's model
  std::unique_ptr<Decoder> decoder;
  std::vector<float> logits;
  NllStats nll;
  DivergenceStats divergence;
};

std::unique_ptr<DivergenceBase> load_divergence_base(const PerplexityOptions& opt, const Model& model, int64_t ctx,
                                                     KVType kv_type) {
  auto base = std::make_unique<DivergenceBase>();
  if (!opt.kl_base_kv_type.empty()) {
    const KVType base_type = parse_kv_type(opt.kl_base_kv_type, "--kl-base-kv-type");
    base->what = std::string("kv ") + kv_type_info(base_type).name;
    base->decoder = make_decoder("cached", model, ctx, base_type);
    return base;
  }
  base->what = "exact f32 activations";
  ModelLoadOptions load = opt.rope.apply({});
  load.activations = ActivationPrecision::kF32;
  base->model = Model::load(opt.model, load);
  base->decoder = make_decoder("cached", *base->model, ctx, kv_type);
  return base;
}

// score_window for both runs (this one's NLLs into stats, the base's into base.nll) and their divergence, each
// row's log_sum_exp computed once.
void compare_window(std::span<const float> test, const std::vector<int32_t>& window, int64_t vocab, NllStats& stats,
                    DivergenceBase& base) {
  const auto n = static_cast<int64_t>(window.size());
  for (int64_t i = n / 2; i + 1 < n; ++i) {
    const int32_t target = window[static_cast<size_t>(i + 1)];
    const std::span<const float> p = logits_row(base.logits, i, vocab), q = logits_row(test, i, vocab);
    const double p_norm = log_sum_exp(p), q_norm = log_sum_exp(q);
    const double p_nll = negative_log_likelihood(p, p_norm, target), q_nll = negative_log_likelihood(q, q_norm, target);
    base.nll.add(p_nll);
    stats.add(q_nll);
    base.divergence.add(p, p_norm, p_nll, q, q_norm, q_nll);
  }
}

void print_divergence(const DivergenceBase& base, const NllStats& test) {
  const DivergenceStats& d = base.divergence;
  const double n = static_cast<double>(d.count);
  const double change = d.nll_change.mean(), error = d.nll_change.standard_error();
  std::printf("KL divergence from %s: mean %.6f, max %.4f; same top token %.2f%%; "
              "PPL base %.4f, this run %.4f (%+.3f%% +/- %.3f%%)\n",
              base.what.c_str(), d.kl_sum / n, d.kl_max, 100.0 * static_cast<double>(d.same_top) / n,
              std::exp(base.nll.mean()), std::exp(test.mean()), 100.0 * (std::exp(change) - 1.0), 100.0 * error);
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
  const bool compare = opt.kl_divergence || !opt.kl_base_kv_type.empty();
  std::unique_ptr<DivergenceBase> base = compare ? load_divergence_base(opt, *model, ctx, kv_type) : nullptr;
  NllStats stats;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    const std::vector<int32_t> window = window_at(tokens, w, ctx, bos);
    if (base) {
      const std::span<const float> exact = window_logits(*base->decoder, window);
      base->logits.assign(exact.begin(), exact.end());
      compare_window(window_logits(*decoder, window), window, vocab, stats, *base);
    } else {
      score_window(window_logits(*decoder, window), window, vocab, stats);
    }
    std::fprintf(stderr, "[%lld] %.4f\n", static_cast<long long>(w + 1), std::exp(stats.mean()));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double ppl = std::exp(stats.mean());
  std::printf("PPL = %.4f +/- %.4f (%lld scored tokens, kv %s, %lld bytes/token of KV cache)\n", ppl,
              ppl * stats.standard_error(), static_cast<long long>(stats.count), kv_type_info(kv_type).name,
              static_cast<long long>(kv_bytes_per_token(model->config(), kv_type)));
  std::printf("evaluated %lld tokens in %.2f s: %.1f tokens/s\n", static_cast<long long>(windows * ctx), seconds,
              static_cast<double>(windows * ctx) / std::max(seconds, 1e-9));
  if (base) print_divergence(*base, stats);
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
  cmd->add_flag("--kl-divergence", opt->kl_divergence,
                "Also run the model with exact f32 activations and print the mean KL divergence of this run's "
                "distributions from those, the top-token agreement and both perplexities");
  cmd->add_option("--kl-base-kv-type", opt->kl_base_kv_type,
                  "Compare against this run's activations over a KV cache of this type instead (implies "
                  "--kl-divergence): what --kv-type costs, e.g. --kv-type q8_0 --kl-base-kv-type f16");
  cmd->callback([opt] { run_perplexity(*opt); });
}

}  // namespace kvserve::cli

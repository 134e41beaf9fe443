// The ladder's reports: markdown table, JSON, and the bar chart.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "ladder/ladder.h"

namespace kvserve {
namespace {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// 1234567 -> "1,234,567".
std::string grouped(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string mebibytes(int64_t bytes) { return fixed(static_cast<double>(bytes) / (1024.0 * 1024.0), 1) + " MiB"; }

// Three significant figures at most, enough for a speed.
std::string speed(double v) { return fixed(v, v >= 100 ? 0 : v >= 10 ? 1 : 2); }

std::string ratio(double num, double den) { return den > 0 ? speed(num / den) + "x" : "-"; }

std::string same_text(const LadderRung& r) {
  std::string s = r.agreement >= 1.0 ? "yes" : fixed(100.0 * r.agreement, 1) + "% of tokens";
  if (r.scaled) s += " (" + std::to_string(r.measured_tokens) + " tokens run)";
  return s;
}

std::string rows_cell(const LadderRung& r) {
  if (!r.scaled) return grouped(r.full_attention_rows);
  return grouped(r.full_attention_rows) + " (" + grouped(r.attention_rows) + " counted)";
}

std::string scaled_note(const LadderRung& r, const LadderResult& result) {
  return "rung " + std::to_string(r.number) + " ran " + std::to_string(r.measured_requests) + " of " +
         std::to_string(result.requests) + " requests (" + std::to_string(r.measured_tokens) + " of " +
         std::to_string(r.output_tokens) + " output tokens, " + grouped(r.attention_rows) +
         " attention rows counted); its time is scaled to the whole workload's " + grouped(r.full_attention_rows) +
         " rows";
}

const char* short_label(int rung) {
  static const char* labels[] = {"", "NAIVE", "+KV", "+FLASH", "+QUANT", "+BATCH", "+PREFIX", "+SPEC"};
  return rung >= 1 && rung <= 7 ? labels[rung] : "?";
}

}  // namespace

std::string format_ladder_markdown(const LadderResult& result) {
  std::string s = std::string("| rung | configuration | weights | kernels | output tok/s | ") +
                  (result.long_context ? "vs rung 2" : "vs naive") +
                  " | vs previous | attention rows (per layer) | KV bytes | peak RSS | TTFT p50 | same greedy text |\n"
                  "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
  const double naive = result.rungs.empty() ? 0 : result.rungs.front().tokens_per_s();
  double previous = 0;
  for (const LadderRung& r : result.rungs) {
    const double tps = r.tokens_per_s();
    s += "| " + std::to_string(r.number) + " | " + r.name + " | " + r.weights + " | " + r.isa + ", " +
         std::to_string(r.threads) + (r.threads == 1 ? " thread" : " threads") + " | " + speed(tps) +
         (r.scaled ? " *" : "") + " | " + ratio(tps, naive) + " | " + (previous > 0 ? ratio(tps, previous) : "-") +
         " | " + rows_cell(r) + " | " + mebibytes(r.kv_bytes) + " | " +
         (r.peak_rss_bytes > 0 ? mebibytes(r.peak_rss_bytes) : "-") + " | " + fixed(r.ttft_p50_s, 2) + " s | " +
         same_text(r) + " |\n";
    previous = tps;
  }
  s += "\n";
  for (const LadderRung& r : result.rungs)
    if (r.scaled) s += "\\* " + scaled_note(r, result) + ".\n";
  if (result.long_context) {
    const std::string weights = result.rungs.empty() ? "?" : result.rungs.front().weights;
    s += "\nLong context: rungs 2 and 3 only, both on the " + weights +
         " weights with rung 4's kernels and threads, one request at a time; same greedy text: rung 3 against "
         "rung 2.\n";
    return s;
  }
  s += "\nCounted work for N = " + std::to_string(result.counted.n) +
       " tokens decoded one at a time (the decoders' own attention_rows() counters, per layer): naive " +
       grouped(result.counted.naive_rows) + " rows, cached " + grouped(result.counted.cached_rows) + " rows.\n";
  s += "\nRungs 1-3 run " + result.f32_weights_note + "; rungs 4-7 run " + result.quantized_note +
       ". Same greedy text: rungs 1-3 against rung 2, rungs 4-7 against rung 4 (same weights); rung 4's tokens "
       "agree with rung 2's on " + fixed(100.0 * result.f32_quantized_agreement, 1) +
       "% (common prefix per request: quantized weights legitimately change the greedy text).\n";
  for (const LadderRung& r : result.rungs)
    if (!r.note.empty()) s += "Rung " + std::to_string(r.number) + ": " + r.note + ".\n";
  return s;
}

nlohmann::json ladder_json(const LadderResult& result) {
  nlohmann::json j = {{"model", result.model_name}, {"model_path", result.model_path},
                      {"requests", result.requests}, {"prompt_len", result.prompt_len},
                      {"gen_len", result.gen_len},   {"shared_prefix", result.shared_prefix},
                      {"long_context", result.long_context},
                      {"f32_weights", result.f32_weights_note}, {"quantized_weights", result.quantized_note},
                      {"quantized_vs_f32_token_agreement", result.f32_quantized_agreement},
                      {"counted_work", {{"n", result.counted.n}, {"naive_attention_rows", result.counted.naive_rows},
                                        {"cached_attention_rows", result.counted.cached_rows}}}};
  j["rungs"] = nlohmann::json::array();
  for (const LadderRung& r : result.rungs)
    j["rungs"].push_back({{"rung", r.number}, {"name", r.name}, {"weights", r.weights}, {"isa", r.isa},
                          {"threads", r.threads}, {"seconds", r.seconds}, {"output_tokens", r.output_tokens},
                          {"output_tokens_per_s", r.tokens_per_s()}, {"scaled", r.scaled},
                          {"measured_requests", r.measured_requests}, {"measured_tokens", r.measured_tokens},
                          {"attention_rows_counted", r.attention_rows}, {"attention_rows_full", r.full_attention_rows},
                          {"kv_bytes", r.kv_bytes}, {"peak_rss_bytes", r.peak_rss_bytes},
                          {"ttft_p50_s", r.ttft_p50_s}, {"token_agreement", r.agreement},
                          {"agreement_reference", r.reference}, {"note", r.note}});
  return j;
}

RgbImage plot_ladder(const LadderResult& result) {
  constexpr int kWidth = 900, kHeight = 460, kLeft = 40, kRight = 20, kTop = 60, kBottom = 70;
  constexpr uint32_t kInk = 0x202020, kBar = 0x3070C0, kScaledBar = 0x90B0D8, kGrid = 0xE0E0E0;
  RgbImage image(kWidth, kHeight, 0xFFFFFF);
  image.draw_text(kLeft, 10, "KVSERVE LADDER: OUTPUT TOKENS/S (LOG SCALE)", kInk, 2);
  image.draw_text(kLeft, 32, result.model_name + ", " + std::to_string(result.requests) + " REQUESTS X " +
                                 std::to_string(result.prompt_len) + " PROMPT + " + std::to_string(result.gen_len) +
                                 " GENERATED TOKENS", kInk);
  if (result.rungs.empty()) return image;
  double lo = 1e30, hi = 0;
  for (const LadderRung& r : result.rungs) {
    lo = std::min(lo, r.tokens_per_s());
    hi = std::max(hi, r.tokens_per_s());
  }
  // Whole decades around the data, so each grid line is a power of ten.
  const double decade_lo = std::floor(std::log10(std::max(lo, 1e-6))), decade_hi = std::ceil(std::log10(std::max(hi, 1e-6)) + 0.15);
  const int plot_h = kHeight - kTop - kBottom;
  const auto y_of = [&](double v) {
    const double t = (std::log10(std::max(v, 1e-6)) - decade_lo) / std::max(decade_hi - decade_lo, 1.0);
    return kTop + plot_h - static_cast<int>(t * plot_h);
  };
  for (double d = decade_lo; d <= decade_hi; d += 1) {
    const int y = y_of(std::pow(10.0, d));
    image.fill_rect(kLeft, y, kWidth - kRight, y + 1, kGrid);
    image.draw_text(2, y - 3, d >= 0 ? fixed(std::pow(10.0, d), 0) : fixed(std::pow(10.0, d), static_cast<int>(-d)), kInk);
  }
  const int slot = (kWidth - kLeft - kRight) / static_cast<int>(result.rungs.size());
  const double naive = result.rungs.front().tokens_per_s();
  for (size_t i = 0; i < result.rungs.size(); ++i) {
    const LadderRung& r = result.rungs[i];
    const int x0 = kLeft + static_cast<int>(i) * slot + slot / 6, x1 = x0 + slot * 2 / 3, y = y_of(r.tokens_per_s());
    image.fill_rect(x0, y, x1, kTop + plot_h, r.scaled ? kScaledBar : kBar);
    const std::string value = speed(r.tokens_per_s()), gain = ratio(r.tokens_per_s(), naive);
    image.draw_text((x0 + x1 - RgbImage::text_width(value)) / 2, y - 22, value, kInk);
    image.draw_text((x0 + x1 - RgbImage::text_width(gain)) / 2, y - 11, gain, kBar);
    const std::string label = std::to_string(r.number) + " " + short_label(r.number);
    image.draw_text((x0 + x1 - RgbImage::text_width(label)) / 2, kTop + plot_h + 8, label, kInk);
  }
  image.draw_text(kLeft, kHeight - 30, "BARS: TOKENS/S; BLUE TEXT: SPEED-UP VS NAIVE; PALE BAR: SCALED FROM A PREFIX", kInk);
  return image;
}

}  // namespace kvserve

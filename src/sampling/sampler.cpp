#include "sampling/sampler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "core/error.h"

namespace kvserve {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
constexpr size_t kMaxVocab = static_cast<size_t>(std::numeric_limits<int32_t>::max());

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

[[noreturn]] void throw_bad_param(const char* name, const char* requirement, double got) {
  throw Error(std::string(name) + " must be " + requirement + ", got " + format_number(got));
}

void check_logits_size(std::span<const float> logits) {
  if (logits.empty()) throw Error("logits must not be empty");
  if (logits.size() > kMaxVocab)
    throw Error("logits has " + std::to_string(logits.size()) + " entries, more than int32 token ids can address");
}

// Every logit must be finite or -inf, and at least one must be finite: NaN or
// +inf would turn the softmax into NaN and silently corrupt every later step.
void check_logits(std::span<const float> logits) {
  check_logits_size(logits);
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == -kMinusInf)
      throw Error("logits[" + std::to_string(i) + "] is " + format_number(v) + "; logits must be finite or -inf");
    any_finite |= (v != kMinusInf);
  }
  if (!any_finite) throw Error("logits: every token is masked (-inf), so none can be chosen");
}

float penalized_logit(float logit, size_t count, const SamplingParams& p) {
  double v = logit;
  v = v > 0.0 ? v / p.repetition_penalty : v * p.repetition_penalty;
  v -= static_cast<double>(count) * p.frequency_penalty + p.presence_penalty;
  // Clamped so that extreme penalties cannot create +inf (NaN in softmax) or
  // mask a token by overflowing to -inf.
  return static_cast<float>(std::clamp(v, -static_cast<double>(FLT_MAX), static_cast<double>(FLT_MAX)));
}

}  // namespace

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || std::isinf(temperature))
    throw_bad_param("temperature", "finite and >= 0 (0 means greedy)", temperature);
  if (!(top_p > 0.0f && top_p <= 1.0f)) throw_bad_param("top_p", "in (0, 1]", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) throw_bad_param("min_p", "in [0, 1]", min_p);
  if (!(repetition_penalty > 0.0f) || std::isinf(repetition_penalty))
    throw_bad_param("repetition_penalty", "finite and > 0 (1 disables)", repetition_penalty);
  if (repeat_last_n < -1)
    throw_bad_param("repeat_last_n", ">= -1 (-1 means the whole history, 0 disables penalties)", repeat_last_n);
  if (!std::isfinite(presence_penalty)) throw_bad_param("presence_penalty", "finite", presence_penalty);
  if (!std::isfinite(frequency_penalty)) throw_bad_param("frequency_penalty", "finite", frequency_penalty);
}

int32_t argmax(std::span<const float> logits) {
  check_logits_size(logits);
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v)) continue;
    // Strictly greater: on a tie the lowest id, seen first, stays.
    if (best < 0 || v > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  if (best < 0) throw Error("logits: every entry is NaN");
  return best;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { params_.validate(); }

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  run_chain(logits, history);
  if (params_.temperature == 0.0f) return candidates_.front().id;
  // Inverse-CDF draw. The order of candidates_ is deterministic, so the same
  // seed replays the same tokens.
  const double u = rng_.next_uniform();
  double cumulative = 0.0;
  for (const Candidate& c : candidates_) {
    cumulative += c.value;
    if (u < cumulative) return c.id;
  }
  return candidates_.back().id;  // rounding left the total a hair under 1
}

int32_t Sampler::greedy_choice(std::span<const float> logits, std::span<const int32_t> history,
                               std::vector<float>& scratch) {
  check_logits(logits);
  if (!penalizes(history)) return argmax(logits);
  scratch.assign(logits.begin(), logits.end());
  apply_penalties(scratch, history);
  return argmax(scratch);
}

void Sampler::distribution(std::span<float> logits, std::span<const int32_t> history, std::vector<float>& probs) {
  run_chain(logits, history);
  probs.assign(logits.size(), 0.0f);
  for (const Candidate& c : candidates_) probs[static_cast<size_t>(c.id)] = c.value;
}

void Sampler::log_softmax(std::span<const float> logits, std::vector<float>& out) {
  check_logits(logits);
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (const float v : logits) sum += std::exp(static_cast<double>(v) - max_logit);
  const double log_sum = std::log(sum);
  out.resize(logits.size());
  // (v - max) - log_sum rather than v - (max + log_sum): keeps the precision of
  // the small differences when logits are large.
  for (size_t i = 0; i < logits.size(); ++i)
    out[i] = static_cast<float>((static_cast<double>(logits[i]) - max_logit) - log_sum);
}

void Sampler::run_chain(std::span<float> logits, std::span<const int32_t> history) {
  check_logits(logits);
  apply_penalties(logits, history);
  if (params_.temperature == 0.0f) {
    candidates_.assign(1, Candidate{argmax(logits), 1.0f});
    return;
  }
  gather_candidates(logits);  // with top-k
  softmax_with_temperature();
  keep_min_p();
  keep_top_p();
  renormalize();
}

bool Sampler::penalizes(std::span<const int32_t> history) const {
  const bool any_penalty = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                           params_.frequency_penalty != 0.0f;
  return any_penalty && params_.repeat_last_n != 0 && !history.empty();
}

void Sampler::apply_penalties(std::span<float> logits, std::span<const int32_t> history) {
  if (!penalizes(history)) return;
  const size_t window_len = params_.repeat_last_n < 0
                                ? history.size()
                                : std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
  const auto window = history.last(window_len);
  // Sorting a copy of the window groups equal ids into runs: counts without a
  // vocabulary-sized table to clear on every call.
  window_.assign(window.begin(), window.end());
  std::sort(window_.begin(), window_.end());
  const int32_t vocab = static_cast<int32_t>(logits.size());
  for (const int32_t id : {window_.front(), window_.back()}) {
    if (id < 0 || id >= vocab)
      throw Error("history holds token id " + std::to_string(id) + ", outside the vocabulary [0, " +
                  std::to_string(vocab) + ")");
  }
  for (size_t run = 0; run < window_.size();) {
    const int32_t id = window_[run];
    size_t end = run;
    while (end < window_.size() && window_[end] == id) ++end;
    float& logit = logits[static_cast<size_t>(id)];
    if (logit != kMinusInf) logit = penalized_logit(logit, end - run, params_);  // masked stays masked
    run = end;
  }
}

bool Sampler::more_likely(const Candidate& a, const Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

void Sampler::gather_candidates(std::span<const float> logits) {
  candidates_.clear();
  const size_t k = params_.top_k > 0 ? static_cast<size_t>(params_.top_k) : 0;
  if (k > 0 && k < logits.size()) {
    gather_top_k(logits, k);
  } else {
    candidates_.reserve(logits.size());  // allocates on the first call only
    for (size_t i = 0; i < logits.size(); ++i)
      if (logits[i] != kMinusInf) candidates_.push_back(Candidate{static_cast<int32_t>(i), logits[i]});
  }
  check(!candidates_.empty(), "check_logits guarantees an unmasked token and penalties keep it finite");
}

// Top-k runs on logits, before temperature: dividing by T > 0 keeps their
// order. The k best so far sit in a heap with the least likely on top; most
// tokens lose one comparison against it, so this is about one pass over the
// vocabulary rather than gathering all of it and partitioning.
void Sampler::gather_top_k(std::span<const float> logits, size_t k) {
  candidates_.reserve(k);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == kMinusInf) continue;
    const Candidate token{static_cast<int32_t>(i), logits[i]};
    if (candidates_.size() < k) {
      candidates_.push_back(token);
      std::push_heap(candidates_.begin(), candidates_.end(), more_likely);
    } else if (more_likely(token, candidates_.front())) {
      std::pop_heap(candidates_.begin(), candidates_.end(), more_likely);
      candidates_.back() = token;
      std::push_heap(candidates_.begin(), candidates_.end(), more_likely);
    }
  }
}

void Sampler::softmax_with_temperature() {
  float max_logit = candidates_.front().value;
  for (const Candidate& c : candidates_) max_logit = std::max(max_logit, c.value);
  // Temperature is applied as (logit - max) / T rather than scaling first:
  // a tiny T then underflows to probability 0 instead of overflowing to inf.
  const float temperature = params_.temperature;
  double sum = 0.0;
  for (Candidate& c : candidates_) {
    c.value = std::exp((c.value - max_logit) / temperature);
    sum += c.value;
  }
  const double inv_sum = 1.0 / sum;  // sum >= 1: the max contributes exp(0)
  for (Candidate& c : candidates_) c.value = static_cast<float>(c.value * inv_sum);
}

// Runs before keep_top_p although the chain is defined as top-p then min-p:
// both keep a most-likely prefix, and min-p compares p / p_max, which top-p's
// renormalization does not change, so the kept set is the shorter of the two
// prefixes either way. Filtering first leaves top-p only a few candidates to
// sort instead of the whole vocabulary.
void Sampler::keep_min_p() {
  if (params_.min_p <= 0.0f) return;
  float p_max = 0.0f;
  for (const Candidate& c : candidates_) p_max = std::max(p_max, c.value);
  const float threshold = params_.min_p * p_max;
  std::erase_if(candidates_, [threshold](const Candidate& c) { return c.value < threshold; });
}

// The probabilities are still those of the post-top-k softmax (min-p does not
// renormalize), so the cumulative mass here is top-p's own. The cut is found
// by bisection with nth_element rather than by sorting: a flat distribution
// over a 150k vocabulary can keep tens of thousands of tokens, and only the
// small range around the cut ever gets sorted. Expected cost: about two passes.
void Sampler::keep_top_p() {
  if (params_.top_p >= 1.0f) return;
  constexpr size_t kSortBelow = 64;
  const auto at = [this](size_t i) { return candidates_.begin() + static_cast<ptrdiff_t>(i); };
  // Invariant: [0, lo) are the lo most likely candidates, holding mass_before
  // < top_p; the last kept candidate lies in [lo, hi).
  size_t lo = 0;
  size_t hi = candidates_.size();
  double mass_before = 0.0;
  while (hi - lo > kSortBelow) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(at(lo), at(mid), at(hi), more_likely);
    double upper_mass = 0.0;
    for (size_t i = lo; i < mid; ++i) upper_mass += candidates_[i].value;
    if (mass_before + upper_mass >= params_.top_p) {
      hi = mid;
    } else {
      mass_before += upper_mass;
      lo = mid;
    }
  }
  std::sort(at(lo), at(hi), more_likely);
  double mass = mass_before;
  for (size_t i = lo; i < hi; ++i) {
    mass += candidates_[i].value;
    if (mass >= params_.top_p) {
      hi = i + 1;
      break;
    }
  }
  // Falling through keeps [0, hi): all of it, or a range whose mass reached
  // top_p in a different summation order.
  candidates_.resize(hi);
}

void Sampler::renormalize() {
  double sum = 0.0;
  for (const Candidate& c : candidates_) sum += c.value;
  check(sum > 0.0, "the most likely candidate always survives with probability > 0");
  const double inv_sum = 1.0 / sum;
  for (Candidate& c : candidates_) c.value = static_cast<float>(c.value * inv_sum);
}

}  // namespace kvserve

#include "model/synth.h"

#include <cctype>
#include <cmath>
#include <numbers>
#include <optional>
#include <span>
#include <iterator>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/quantize.h"
#include "model/gguf_writer.h"
#include "model/gguf_token_type.h"

namespace kvserve {
namespace {

// ---------------------------------------------------------------------------
// Byte-level BPE vocabulary

// Most frequent first: the rank sets each word's weight in the corpus.
constexpr const char* kCorpusWords[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with",
    "as", "I", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "not", "word",
    "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your",
    "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many",
    "then", "them", "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him",
    "two", "has", "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most",
    "people", "my", "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been",
    "now", "find", "any", "new", "work", "part", "take", "get", "place", "made", "live", "where", "after",
    "back", "little", "only", "round", "man", "year", "came", "show", "every", "good", "me", "give", "our",
    "under", "name", "very", "through", "just", "form", "sentence", "great", "think", "say", "help", "low",
    "line", "differ", "turn", "cause", "much", "mean", "before", "move", "right", "boy", "old", "too",
    "same", "tell", "does", "set", "three", "want", "air", "well", "also", "play", "small", "end", "put",
    "home", "read", "hand", "port", "large", "spell", "add", "even", "land", "here", "must", "big", "high",
    "such", "follow", "act", "why", "ask", "men", "change", "went", "light", "kind", "off", "need", "house",
    "picture", "try", "us", "again", "animal", "point", "mother", "world", "near", "build", "self", "earth",
    "father", "head", "stand", "own", "page", "should", "country", "found", "answer", "school", "grow",
    "study", "still", "learn", "plant", "cover", "food", "sun", "four", "between", "state", "keep", "eye",
    "never", "last", "let", "thought", "city", "tree", "cross", "farm", "hard", "start", "might", "story",
    "saw", "far", "sea", "draw", "left", "late", "run", "while", "press", "close", "night", "real", "life",
    "few", "north", "open", "seem", "together", "next", "white", "children", "begin", "got", "walk",
    "example", "ease", "paper", "group", "always", "music", "those", "both", "mark", "often", "letter",
    "until", "mile", "river", "car", "feet", "care", "second", "book", "carry", "took", "science", "eat",
    "room", "friend", "began", "idea", "fish", "mountain", "stop", "once", "base", "hear", "horse", "cut",
    "sure", "watch", "color", "face", "wood", "main", "enough", "plain", "girl", "usual", "young", "ready",
    "above", "ever", "red", "list", "though", "feel", "talk", "bird", "soon", "body", "dog", "family",
    "direct", "pose", "leave", "song", "measure", "door", "product", "black", "short", "numeral", "class",
    "wind", "question", "happen", "complete", "ship", "area", "half", "rock", "order", "fire", "south",
    "problem", "piece", "told", "knew", "pass", "since", "top", "whole", "king", "space", "heard", "best",
    "hour", "better", "during", "hundred", "five", "remember", "step", "early", "hold", "west", "ground",
    "interest", "reach", "fast", "verb", "sing", "listen", "six", "table", "travel", "less", "morning",
    "ten", "simple", "several", "vowel", "toward", "war", "lay", "against", "pattern", "slow", "center",
    "love", "person", "money", "serve", "appear", "road", "map", "rain", "rule", "govern", "pull", "cold",
    "notice", "voice", "unit", "power", "town", "fine", "certain", "fly", "fall", "lead", "cry", "dark",
    "machine", "note", "wait", "plan", "figure", "star", "box", "noun", "field", "rest", "correct", "able",
    "pound", "done", "beauty", "drive", "stood", "contain", "front", "teach", "week", "final", "gave",
    "green", "oh", "quick", "develop", "ocean", "warm", "free", "minute", "strong", "special", "mind",
    "behind", "clear", "tail", "produce", "fact", "street", "inch", "multiply", "nothing", "course", "stay",
    "wheel", "full", "force", "blue", "object", "decide", "surface", "deep", "moon", "island", "foot",
    "system", "busy", "test", "record", "boat", "common", "gold", "possible", "plane", "instead", "dry",
    "wonder", "laugh", "thousand", "ago", "ran", "check", "game", "shape", "equate", "hot", "miss",
    "brought", "heat", "snow", "tire", "bring", "yes", "distant", "fill", "east", "paint", "language",
    "among", "function", "value", "return", "string", "model", "token", "server", "request", "memory",
};
// Pieces that GPT-2's pre-tokenizer keeps apart from words.
constexpr const char* kCorpusPunctuation[] = {",", ".", "'s", "!", "?", ":", ";", "\n", "\n\n", " (", ")", " \"",
                                              "\"", "'t", " -", "0", "1", "2", "19", "20", " {", "}", "();"};
constexpr const char* kSpecialTokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
// llama.cpp looks these up by name in any model whose general.name says phi3.
constexpr const char* kPhi3SpecialTokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>", "<s>", "</s>", "<|end|>"};

struct CorpusWord {
  std::vector<int32_t> symbols;
  int64_t weight = 0;
};

std::vector<CorpusWord> make_corpus() {
  std::vector<CorpusWord> corpus;
  auto add = [&corpus](const std::string& text, int64_t weight) {
    CorpusWord w;
    for (unsigned char ch : text) w.symbols.push_back(ch);  // byte b is token b
    w.weight = weight;
    corpus.push_back(std::move(w));
  };
  int64_t rank = 0;
  for (const char* word : kCorpusWords) {
    // Zipf-like weights; mid-sentence words carry their leading space, as
    // GPT-2's pre-tokenizer leaves it.
    const int64_t weight = 1 + 20000 / (rank + 10);
    std::string capitalized = word;
    capitalized[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(capitalized[0])));
    add(std::string(" ") + word, weight);
    add(word, 1 + weight / 4);
    add(" " + capitalized, 1 + weight / 8);
    ++rank;
  }
  for (const char* piece : kCorpusPunctuation) add(piece, 400);
  return corpus;
}

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); }

class BpeBuilder {
 public:
  explicit BpeBuilder(size_t target) : target_(target) {
    for (int b = 0; b < 256; ++b) add_token(gpt2_byte_symbol(static_cast<uint8_t>(b)));
  }

  // Repeatedly merges the corpus' most frequent adjacent pair (ties: the
  // smallest ids) until the vocabulary is full or every word is one token.
  void learn(std::vector<CorpusWord>& corpus) {
    while (tokens_.size() < target_) {
      std::unordered_map<uint64_t, int64_t> counts;
      for (const CorpusWord& w : corpus)
        for (size_t i = 0; i + 1 < w.symbols.size(); ++i) counts[pair_key(w.symbols[i], w.symbols[i + 1])] += w.weight;
      if (counts.empty()) return;
      auto best = counts.begin();
      for (auto it = counts.begin(); it != counts.end(); ++it)
        if (it->second > best->second || (it->second == best->second && it->first < best->first)) best = it;
      const auto left = static_cast<int32_t>(best->first >> 32);
      const auto right = static_cast<int32_t>(best->first & 0xffffffffu);
      const int32_t merged = merge(left, right);
      for (CorpusWord& w : corpus) replace_pair(w.symbols, left, right, merged);
    }
  }

  // Fills the rest with merges of existing tokens and single bytes, learnt
  // tokens first, so that every merge result is a new token.
  void pad() {
    for (size_t left = tokens_.size() > 256 ? 256 : 0; tokens_.size() < target_; ++left)
      for (int right = 0; right < 256 && tokens_.size() < target_; ++right)
        if (!ids_.count(tokens_[left] + tokens_[right]))
          merge(static_cast<int32_t>(left), static_cast<int32_t>(right));
  }

  std::vector<std::string>& tokens() { return tokens_; }
  std::vector<std::string>& merges() { return merges_; }

 private:
  int32_t add_token(const std::string& text) {
    const auto id = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(text);
    ids_.emplace(text, id);
    return id;
  }
  int32_t merge(int32_t left, int32_t right) {
    merges_.push_back(tokens_[left] + " " + tokens_[right]);
    const std::string text = tokens_[left] + tokens_[right];
    auto it = ids_.find(text);  // two merge paths can reach the same string
    return it != ids_.end() ? it->second : add_token(text);
  }
  static void replace_pair(std::vector<int32_t>& symbols, int32_t left, int32_t right, int32_t merged) {
    size_t out = 0;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
        symbols[out++] = merged;
        ++i;
      } else {
        symbols[out++] = symbols[i];
      }
    }
    symbols.resize(out);
  }

  size_t target_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> merges_;
};

// ---------------------------------------------------------------------------
// Deterministic normal random numbers

// Box-Muller normals from the project's seeded generator.
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : rng_(seed) {}
  // Fills out[0..n) with independent standard normals times `scale`.
  void fill_normal(float* out, int64_t n, float scale) {
    constexpr double kTwoPi = 6.283185307179586;
    for (int64_t i = 0; i < n; i += 2) {
      const double u1 = 1.0 - rng_.next_uniform();  // (0, 1]: log(u1) stays finite
      const double u2 = rng_.next_uniform();
      const double radius = std::sqrt(-2.0 * std::log(u1));
      out[i] = static_cast<float>(radius * std::cos(kTwoPi * u2)) * scale;
      if (i + 1 < n) out[i + 1] = static_cast<float>(radius * std::sin(kTwoPi * u2)) * scale;
    }
  }

 private:
  Xoshiro256 rng_;
};

uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the name, mixed with the seed
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  uint64_t state = seed ^ h;
  return splitmix64(state);
}

// ---------------------------------------------------------------------------
// Tensors and metadata

class ModelSynthesizer {
 public:
  ModelSynthesizer(GGUFWriter& writer, DType type, uint64_t seed) : w_(writer), type_(type), seed_(seed) {}

  // A [rows, cols] matrix (ne = {cols, rows}) of normals scaled 1/sqrt(cols),
  // so that a unit-RMS input gives unit-RMS outputs.
  void matrix(const std::string& name, int64_t cols, int64_t rows) { stacked(name, cols, rows, 0); }
  // n > 0: n such matrices stacked (ne = {cols, rows, n}: experts); row r of
  // matrix i is the stack's row i * rows + r. scale: times 1/sqrt(cols).
  void stacked(const std::string& name, int64_t cols, int64_t rows_each, int64_t n, float scale_factor = 1.0f,
               std::optional<DType> forced_type = std::nullopt) {
    const int64_t rows = rows_each * std::max<int64_t>(n, 1);
    const DType type = forced_type.value_or(type_for_row_length(cols));
    const size_t row_bytes = dtype_row_bytes(type, cols);
    std::vector<uint8_t> bytes(row_bytes * static_cast<size_t>(rows));
    const uint64_t base = tensor_seed(seed_, name);
    const float scale = scale_factor / std::sqrt(static_cast<float>(cols));
    // Threads only pay off for big tensors; tiny ones stay on one thread.
#pragma omp parallel if (rows * cols >= (1 << 18))
    {
      std::vector<float> row(static_cast<size_t>(cols));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        NormalRng rng(base + static_cast<uint64_t>(r) * 0x9e3779b97f4a7c15ull);
        rng.fill_normal(row.data(), cols, scale);
        quantize_row(type, row.data(), bytes.data() + static_cast<size_t>(r) * row_bytes, cols);
      }
    }
    if (n > 0) w_.add_tensor(name, type, {cols, rows_each, n}, bytes.data(), bytes.size());
    else w_.add_tensor(name, type, {cols, rows}, bytes.data(), bytes.size());
  }
  // K-quant rows must hold whole 256-value super-blocks; like llama.cpp, a
  // matrix whose rows do not falls back to a 32-block type (Q6_K to Q8_0,
  // Q4_K / Q5_K to Q5_0, IQ4_XS to IQ4_NL, Q2_K / Q3_K to Q4_0).
  DType type_for_row_length(int64_t cols) const {
    if (cols % dtype_info(type_).block_size == 0) return type_;
    if (type_ == DType::IQ4_XS) return DType::IQ4_NL;
    if (type_ == DType::Q2_K || type_ == DType::Q3_K) return DType::Q4_0;
    return type_ == DType::Q6_K ? DType::Q8_0 : DType::Q5_0;
  }
  void ones(const std::string& name, int64_t n) { w_.add_f32_tensor(name, {n}, std::vector<float>(n, 1.0f)); }
  // Norm weights near 1 (not all 1: a test sees whether they are applied).
  void norm(const std::string& name, int64_t n) {
    std::vector<float> values(static_cast<size_t>(n));
    NormalRng(tensor_seed(seed_, name)).fill_normal(values.data(), n, 0.2f);
    for (float& v : values) v += 1.0f;
    w_.add_f32_tensor(name, {n}, values);
  }
  void bias(const std::string& name, int64_t n, float scale = 0.02f) {
    std::vector<float> values(static_cast<size_t>(n));
    NormalRng(tensor_seed(seed_, name)).fill_normal(values.data(), n, scale);
    w_.add_f32_tensor(name, {n}, values);
  }

 private:
  GGUFWriter& w_;
  DType type_;
  uint64_t seed_;
};

// A Qwen MoE block's FFN as llama.cpp's converter writes it: the router in
// f32 (llama.cpp never quantizes ffn_gate_inp), each projection's experts
// stacked in one 3-D tensor, and qwen2moe's shared expert with its gate.
void add_experts(ModelSynthesizer& synth, const SynthPreset& p, const std::string& prefix) {
  const int64_t E = p.n_experts, ff = p.expert_ffn_dim;
  // Logits of ~2x unit spread: routing as decisive as a trained router's,
  // so that few tokens sit on a near-tie between experts.
  synth.stacked(prefix + "ffn_gate_inp.weight", p.dim, E, 0, 2.0f, DType::F32);
  synth.stacked(prefix + "ffn_gate_exps.weight", p.dim, ff, E);
  synth.stacked(prefix + "ffn_up_exps.weight", p.dim, ff, E);
  synth.stacked(prefix + "ffn_down_exps.weight", ff, p.dim, E);
  if (p.expert_bias) synth.bias(prefix + "exp_probs_b.bias", E, 0.1f);
  if (p.shared_expert_ffn_dim == 0) return;
  if (p.arch == "qwen2moe") synth.bias(prefix + "ffn_gate_inp_shexp.weight", p.dim);  // deepseek's are ungated
  synth.matrix(prefix + "ffn_gate_shexp.weight", p.dim, p.shared_expert_ffn_dim);
  synth.matrix(prefix + "ffn_up_shexp.weight", p.dim, p.shared_expert_ffn_dim);
  synth.matrix(prefix + "ffn_down_shexp.weight", p.shared_expert_ffn_dim, p.dim);
}

// deepseek2's MLA tensors as llama.cpp's current converter writes them
// (attn_k_b / attn_v_b split per head, not the older fused attn_kv_b).
void add_mla_attention(ModelSynthesizer& synth, const SynthPreset& p, const std::string& prefix) {
  const int64_t H = p.n_heads, kq = p.qk_nope_dim + p.qk_rope_dim, rank = p.kv_lora_rank;
  if (p.q_lora_rank > 0) {
    synth.matrix(prefix + "attn_q_a.weight", p.dim, p.q_lora_rank);
    synth.norm(prefix + "attn_q_a_norm.weight", p.q_lora_rank);
    synth.matrix(prefix + "attn_q_b.weight", p.q_lora_rank, H * kq);
  } else {
    synth.matrix(prefix + "attn_q.weight", p.dim, H * kq);
  }
  synth.matrix(prefix + "attn_kv_a_mqa.weight", p.dim, rank + p.qk_rope_dim);
  synth.norm(prefix + "attn_kv_a_norm.weight", rank);
  if (p.mla_fused_kv_b) {
    synth.matrix(prefix + "attn_kv_b.weight", rank, H * (p.qk_nope_dim + p.v_head_dim));
  } else {
    synth.stacked(prefix + "attn_k_b.weight", p.qk_nope_dim, rank, H);
    synth.stacked(prefix + "attn_v_b.weight", rank, p.v_head_dim, H);
  }
  synth.matrix(prefix + "attn_output.weight", H * p.v_head_dim, p.dim);
}

void add_block(ModelSynthesizer& synth, const SynthPreset& p, int layer) {
  const std::string prefix = "blk." + std::to_string(layer) + ".";
  const int64_t q_dim = static_cast<int64_t>(p.n_heads) * p.head_dim();
  const int64_t kv_dim = static_cast<int64_t>(p.n_kv_heads) * p.head_dim();
  synth.ones(prefix + "attn_norm.weight", p.dim);
  if (p.kv_lora_rank > 0) {
    add_mla_attention(synth, p, prefix);
  } else if (p.fused) {
    synth.matrix(prefix + "attn_qkv.weight", p.dim, q_dim + 2 * kv_dim);
  } else {
    synth.matrix(prefix + "attn_q.weight", p.dim, q_dim);
    synth.matrix(prefix + "attn_k.weight", p.dim, kv_dim);
    synth.matrix(prefix + "attn_v.weight", p.dim, kv_dim);
  }
  if (p.qkv_bias) {
    synth.bias(prefix + "attn_q.bias", q_dim);
    synth.bias(prefix + "attn_k.bias", kv_dim);
    synth.bias(prefix + "attn_v.bias", kv_dim);
  }
  if (p.qk_norm) {
    synth.norm(prefix + "attn_q_norm.weight", p.head_dim());
    synth.norm(prefix + "attn_k_norm.weight", p.head_dim());
  }
  if (p.kv_lora_rank == 0) synth.matrix(prefix + "attn_output.weight", q_dim, p.dim);
  if (p.arch == "gemma3") synth.norm(prefix + "post_attention_norm.weight", p.dim);
  synth.ones(prefix + "ffn_norm.weight", p.dim);
  if (p.n_experts > 0 && layer >= p.leading_dense_blocks) {
    add_experts(synth, p, prefix);
    return;
  }
  if (p.fused) {
    synth.matrix(prefix + "ffn_up.weight", p.dim, 2 * static_cast<int64_t>(p.ffn_dim));
  } else {
    synth.matrix(prefix + "ffn_gate.weight", p.dim, p.ffn_dim);
    synth.matrix(prefix + "ffn_up.weight", p.dim, p.ffn_dim);
  }
  synth.matrix(prefix + "ffn_down.weight", p.ffn_dim, p.dim);
  if (p.arch == "gemma3") synth.norm(prefix + "post_ffw_norm.weight", p.dim);
}

// Llama 3.1's RoPE scaling (low / high frequency factors 1 and 4 over an
// original context of 8192) as llama.cpp's converter turns it into
// rope_freqs.weight: each pair's angle is divided by its factor.
std::vector<float> llama3_rope_freq_factors(int head_dim, float theta, float factor) {
  constexpr double kLowFreqFactor = 1.0, kHighFreqFactor = 4.0, kOriginalContext = 8192.0;
  const double low_wavelen = kOriginalContext / kLowFreqFactor, high_wavelen = kOriginalContext / kHighFreqFactor;
  std::vector<float> factors;
  for (int i = 0; i < head_dim; i += 2) {
    const double wavelen = 2.0 * std::numbers::pi * std::pow(static_cast<double>(theta), static_cast<double>(i) / head_dim);
    if (wavelen < high_wavelen) factors.push_back(1.0f);
    else if (wavelen > low_wavelen) factors.push_back(factor);
    else {
      const double smooth = (kOriginalContext / wavelen - kLowFreqFactor) / (kHighFreqFactor - kLowFreqFactor);
      factors.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / factor + smooth)));
    }
  }
  return factors;
}

void write_model_metadata(GGUFWriter& w, const SynthPreset& p, int layers, uint64_t seed) {
  const std::string& a = p.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.name", p.name + "-random");
  w.set_u32(a + ".context_length", static_cast<uint32_t>(p.context_length));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(p.dim));
  w.set_u32(a + ".block_count", static_cast<uint32_t>(layers));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(p.ffn_dim));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(p.n_heads));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(p.n_kv_heads));
  w.set_f32(a + ".rope.freq_base", p.rope_theta);
  w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(p.kv_lora_rank > 0 ? p.qk_rope_dim : p.head_dim()));
  if (p.kv_lora_rank > 0 && p.mla_fused_kv_b) {
    w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(p.qk_nope_dim + p.qk_rope_dim));
    w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(p.v_head_dim));
    w.set_u32(a + ".attention.q_lora_rank", static_cast<uint32_t>(p.q_lora_rank));
    w.set_u32(a + ".attention.kv_lora_rank", static_cast<uint32_t>(p.kv_lora_rank));
  } else if (p.kv_lora_rank > 0) {
    w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(p.kv_lora_rank + p.qk_rope_dim));
    w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(p.kv_lora_rank));
    w.set_u32(a + ".attention.key_length_mla", static_cast<uint32_t>(p.qk_nope_dim + p.qk_rope_dim));
    w.set_u32(a + ".attention.value_length_mla", static_cast<uint32_t>(p.v_head_dim));
    w.set_u32(a + ".attention.q_lora_rank", static_cast<uint32_t>(p.q_lora_rank));
    w.set_u32(a + ".attention.kv_lora_rank", static_cast<uint32_t>(p.kv_lora_rank));
  } else if (p.key_length > 0) {
    w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(p.key_length));
    w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(p.key_length));
  }
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", p.rms_eps);
  if (p.sliding_window > 0) w.set_u32(a + ".attention.sliding_window", static_cast<uint32_t>(p.sliding_window));
  if (p.yarn_factor > 0) {
    w.set_string(a + ".rope.scaling.type", "yarn");
    w.set_f32(a + ".rope.scaling.factor", p.yarn_factor);
    w.set_u32(a + ".rope.scaling.original_context_length", static_cast<uint32_t>(p.yarn_original_context));
    if (p.yarn_log_multiplier > 0) w.set_f32(a + ".rope.scaling.yarn_log_multiplier", p.yarn_log_multiplier);
  }
  if (p.n_experts > 0) {
    w.set_u32(a + ".expert_count", static_cast<uint32_t>(p.n_experts));
    w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(p.n_experts_used));
    w.set_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(p.expert_ffn_dim));
  }
  if (p.shared_expert_ffn_dim > 0 && p.arch == "qwen2moe")
    w.set_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(p.shared_expert_ffn_dim));
  if (p.arch == "deepseek" || p.arch == "deepseek2") {
    w.set_u32(a + ".expert_shared_count", static_cast<uint32_t>(p.shared_expert_ffn_dim / p.expert_ffn_dim));
    w.set_u32(a + ".leading_dense_block_count", static_cast<uint32_t>(p.leading_dense_blocks));
    if (p.expert_weights_scale > 0) w.set_f32(a + ".expert_weights_scale", p.expert_weights_scale);
  }
  if (p.arch == "deepseek2") {
    w.set_bool(a + ".expert_weights_norm", p.expert_weights_norm);
    w.set_u32(a + ".expert_gating_func", p.expert_gating_sigmoid ? 2 : 1);
    if (p.expert_groups > 1) {
      w.set_u32(a + ".expert_group_count", static_cast<uint32_t>(p.expert_groups));
      w.set_u32(a + ".expert_group_used_count", static_cast<uint32_t>(p.expert_groups_used));
    }
  }
  w.set_u32(a + ".vocab_size", static_cast<uint32_t>(p.vocab_size));
  w.set_bool("kvserve.synthetic", true);
  w.set_u64("kvserve.synth_seed", seed);
}

void write_vocab_metadata(GGUFWriter& w, const ByteBpeVocab& vocab) {
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "gpt-2");  // llama.cpp knows the GPT-2 pre-tokenizer by this name only
  w.set_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.set_i32_array("tokenizer.ggml.token_type", vocab.token_types);
  w.set_string_array("tokenizer.ggml.merges", vocab.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", vocab.eos_id);
  w.set_u32("tokenizer.ggml.eos_token_id", vocab.eos_id);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_bool("tokenizer.ggml.add_space_prefix", false);
}

bool is_synth_type(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0: case DType::Q4_1:
    case DType::Q5_0: case DType::Q5_1: case DType::IQ4_NL: case DType::IQ4_XS:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return true;
    default: return false;
  }
}

}  // namespace

// deepseek2 presets: MLA over a DeepSeek-MoE block layout.
SynthPreset mla_preset(std::string name, int dim, int layers, int heads, int ffn, int vocab, int context, int q_lora,
                       int kv_lora, int nope, int rope, int v_dim, int experts, int used, int expert_ffn, int shared,
                       int dense_blocks) {
  SynthPreset p;
  p.name = std::move(name);
  p.arch = "deepseek2";
  p.dim = dim;
  p.n_layers = layers;
  p.n_heads = heads;
  p.n_kv_heads = 1;  // the converter's MLA files: one latent "head"
  p.ffn_dim = ffn;
  p.vocab_size = vocab;
  p.context_length = context;
  p.rope_theta = 10000.0f;
  p.rms_eps = 1e-6f;
  p.key_length = kv_lora + rope;
  p.q_lora_rank = q_lora;
  p.kv_lora_rank = kv_lora;
  p.qk_nope_dim = nope;
  p.qk_rope_dim = rope;
  p.v_head_dim = v_dim;
  p.n_experts = experts;
  p.n_experts_used = used;
  p.expert_ffn_dim = expert_ffn;
  p.shared_expert_ffn_dim = shared * expert_ffn;
  p.leading_dense_blocks = dense_blocks;
  return p;
}

// DeepSeek-V3's router on a tiny MLA model with a low-rank query: sigmoid
// scores, exp_probs_b, 4 groups of 4 experts of which 2 may be chosen,
// weights renormalized then scaled 2.5.
SynthPreset tiny_deepseek3() {
  SynthPreset p = mla_preset("tiny-deepseek3", 64, 3, 4, 128, 384, 256, 32, 64, 32, 32, 32, 16, 4, 32, 1, 1);
  p.expert_gating_sigmoid = true;
  p.expert_bias = true;
  p.expert_weights_norm = true;
  p.expert_weights_scale = 2.5f;
  p.expert_groups = 4;
  p.expert_groups_used = 2;
  return p;
}

// DeepSeek-V2-Lite's YaRN (x40 over 4096, mscale_all_dim 0.707 written as 0.1 x 0.707) on the tiny model, scaled
// to its context: x4 over 64.
SynthPreset tiny_deepseek2_yarn() {
  SynthPreset p = mla_preset("tiny-deepseek2-yarn", 64, 3, 4, 128, 384, 256, 0, 64, 32, 32, 32, 8, 2, 32, 2, 1);
  p.yarn_factor = 4.0f;
  p.yarn_original_context = 64;
  p.yarn_log_multiplier = 0.0707f;
  return p;
}

// tiny-deepseek2 in the older layout (a fused attn_kv_b; llama.cpp reads it as
// plain MHA with a decompressed cache, kvserve as MLA).
SynthPreset tiny_deepseek2_fused() {
  SynthPreset p = mla_preset("tiny-deepseek2-fused", 64, 3, 4, 128, 384, 256, 0, 64, 32, 32, 32, 8, 2, 32, 2, 1);
  p.mla_fused_kv_b = true;
  p.n_kv_heads = p.n_heads;
  return p;
}

const std::vector<SynthPreset>& synth_presets() {
  // name, arch, dim, layers, heads, kv heads, ffn, vocab, context, theta, eps, tied, qkv bias, Llama 3 RoPE factor,
  // head size (0: dim / heads), Q/K norms, fused QKV and gate+up, sliding window, experts, used experts, expert
  // FFN width, shared expert width
  static const std::vector<SynthPreset> presets = {
      {"smollm2-135m", "llama", 576, 30, 9, 3, 1536, 49152, 8192, 100000.0f, 1e-5f, true, false, 0.0f, 0, false, false},
      {"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864, 151936, 32768, 1000000.0f, 1e-6f, true, true, 0.0f, 0, false, false},
      {"tinyllama-1.1b", "llama", 2048, 22, 32, 4, 5632, 32000, 2048, 10000.0f, 1e-5f, false, false, 0.0f, 0, false, false},
      {"llama3-8b-2layer", "llama", 4096, 2, 32, 8, 14336, 128256, 8192, 500000.0f, 1e-5f, false, false, 0.0f, 0, false, false},
      {"llama3.2-1b", "llama", 2048, 16, 32, 8, 8192, 128256, 131072, 500000.0f, 1e-5f, true, false, 32.0f, 0, false, false},
      {"tiny-llama", "llama", 64, 2, 4, 2, 96, 320, 256, 10000.0f, 1e-5f, false, false, 0.0f, 0, false, false},
      {"tiny-llama3", "llama", 64, 2, 4, 2, 96, 320, 256, 500000.0f, 1e-5f, true, false, 32.0f, 0, false, false},  // rope_freqs.weight
      {"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 3072, 151936, 40960, 1000000.0f, 1e-6f, true, false, 0.0f, 128, true, false},
      {"tiny-qwen3", "qwen3", 64, 2, 4, 2, 128, 384, 256, 1000000.0f, 1e-6f, true, false, 0.0f, 32, true, false},  // q_dim != dim
      // tiny-qwen3 + YaRN x4 over an original context of 64: prompts of 200 tokens run far into the extension
      {"tiny-qwen3-yarn", "qwen3", 64, 2, 4, 2, 128, 384, 256, 1000000.0f, 1e-6f, true, false, 0.0f, 32, true, false, 0, 0,
       0, 0, 0, 4.0f, 64},
      {"phi3-mini", "phi3", 3072, 32, 32, 32, 8192, 32064, 4096, 10000.0f, 1e-5f, false, false, 0.0f, 0, false, true},
      {"tiny-phi3", "phi3", 64, 2, 4, 4, 96, 320, 256, 10000.0f, 1e-5f, false, false, 0.0f, 0, false, true},
      {"tiny-qwen2", "qwen2", 64, 2, 4, 2, 128, 384, 256, 1000000.0f, 1e-6f, true, true, 0.0f, 0, false, false},
      // rows of 256 and 512: every matrix can hold K-quant super-blocks
      {"tiny-qwen2-256", "qwen2", 256, 2, 4, 2, 512, 384, 256, 1000000.0f, 1e-6f, true, true, 0.0f, 0, false, false},
      {"tiny-hd32", "llama", 128, 2, 4, 2, 128, 320, 256, 10000.0f, 1e-5f, false, false, 0.0f, 0, false, false},  // head size 32: every KV type
      // + sliding window: layers 0-4 slide, layer 5 is global
      {"gemma3-270m", "gemma3", 640, 18, 4, 1, 2048, 262144, 32768, 1000000.0f, 1e-6f, true, false, 0.0f, 256, true, false, 512},
      {"tiny-gemma3", "gemma3", 64, 6, 4, 2, 128, 384, 256, 1000000.0f, 1e-6f, true, false, 0.0f, 32, true, false, 48},
      // mixtures of experts: Qwen3-30B-A3B (128 experts, 8 used) and Qwen1.5-MoE-A2.7B (60, 4, + a shared expert);
      // llama.cpp requires an untied output.weight of qwen2moe files
      {"qwen3-30b-a3b", "qwen3moe", 2048, 48, 32, 4, 6144, 151936, 40960, 1000000.0f, 1e-6f, false, false, 0.0f, 128,
       true, false, 0, 128, 8, 768, 0},
      {"qwen1.5-moe-a2.7b", "qwen2moe", 2048, 24, 16, 16, 5632, 151936, 8192, 1000000.0f, 1e-6f, false, true, 0.0f, 0,
       false, false, 0, 60, 4, 1408, 5632},
      {"tiny-qwen3moe", "qwen3moe", 64, 2, 4, 2, 128, 384, 256, 1000000.0f, 1e-6f, true, false, 0.0f, 32, true, false,
       0, 8, 2, 64, 0},
      // DeepSeek-MoE 16B (64 experts of 1408, 6 used, 2 shared, the first block dense) and a tiny one (its
      // weights scaled 1.5 so that the scale is exercised; the 16B's is 1)
      {"deepseek-moe-16b", "deepseek", 2048, 28, 16, 16, 10944, 102400, 4096, 10000.0f, 1e-6f, false, false, 0.0f, 0,
       false, false, 0, 64, 6, 1408, 2816, 0, 0, 1, 1.0f},
      {"tiny-deepseek", "deepseek", 64, 3, 4, 2, 128, 384, 256, 10000.0f, 1e-6f, false, false, 0.0f, 0, false, false, 0,
       8, 2, 32, 64, 0, 0, 1, 1.5f},
      {"tiny-qwen2moe", "qwen2moe", 64, 2, 4, 2, 128, 384, 256, 1000000.0f, 1e-6f, false, true, 0.0f, 0, false, false, 0,
       8, 4, 32, 96},
      // deepseek2 (MLA): DeepSeek-V2-Lite (16 heads, kv_lora_rank 512, 128 + 64 query/key dims, 128 value dims; 64
      // experts of 1408, 6 used, 2 shared, the first block dense; its YaRN left out), a tiny one, and tiny ones
      // with DeepSeek-V3's router and with V2-Lite's YaRN
      mla_preset("deepseek-v2-lite", 2048, 27, 16, 10944, 102400, 4096, 0, 512, 128, 64, 128, 64, 6, 1408, 2, 1),
      mla_preset("tiny-deepseek2", 64, 3, 4, 128, 384, 256, 0, 64, 32, 32, 32, 8, 2, 32, 2, 1),
      tiny_deepseek3(),
      tiny_deepseek2_yarn(),
      tiny_deepseek2_fused(),
  };
  return presets;
}

const SynthPreset& find_synth_preset(const std::string& name) {
  std::string known;
  for (const SynthPreset& p : synth_presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw Error("synth: unknown preset '" + name + "' (known: " + known + ")");
}

std::string gpt2_byte_symbol(uint8_t byte) {
  // Printable Latin-1 bytes stand for themselves; the others (controls,
  // space, DEL, NBSP, soft hyphen) take code points 256, 257, ... in order.
  auto printable = [](int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); };
  int code_point = byte;
  if (!printable(byte)) {
    code_point = 256;
    for (int b = 0; b < byte; ++b)
      if (!printable(b)) ++code_point;
  }
  std::string utf8;
  if (code_point < 0x80) {
    utf8 += static_cast<char>(code_point);
  } else {
    utf8 += static_cast<char>(0xc0 | (code_point >> 6));
    utf8 += static_cast<char>(0x80 | (code_point & 0x3f));
  }
  return utf8;
}

ByteBpeVocab build_synth_vocab(int vocab_size, bool phi3_specials) {
  const std::span<const char* const> specials =
      phi3_specials ? std::span<const char* const>(kPhi3SpecialTokens) : std::span<const char* const>(kSpecialTokens);
  const size_t kSpecialCount = specials.size();
  if (vocab_size < static_cast<int>(256 + kSpecialCount))
    throw Error("synth: vocabulary size " + std::to_string(vocab_size) + " is below the 256 bytes + " +
                std::to_string(kSpecialCount) + " special tokens");
  BpeBuilder builder(static_cast<size_t>(vocab_size) - kSpecialCount);
  std::vector<CorpusWord> corpus = make_corpus();
  builder.learn(corpus);
  builder.pad();
  ByteBpeVocab vocab;
  vocab.tokens = std::move(builder.tokens());
  vocab.merges = std::move(builder.merges());
  vocab.token_types.assign(vocab.tokens.size(), gguf_token_type::kNormal);
  vocab.eos_id = static_cast<uint32_t>(vocab.tokens.size());
  for (const char* special : specials) {
    vocab.tokens.push_back(special);
    vocab.token_types.push_back(gguf_token_type::kControl);
  }
  return vocab;
}

void synthesize_model(const SynthOptions& options) {
  SynthPreset preset = find_synth_preset(options.preset);
  if (!is_synth_type(options.type))
    throw Error(std::string("synth: type ") + dtype_name(options.type) +
                " is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q2_k, q3_k, q4_k, q5_k, q6_k are)");
  if (options.layers < 0 || options.layers > 1024)
    throw Error("synth: --layers " + std::to_string(options.layers) + " is out of range 1..1024");
  if (options.layers > 0) preset.n_layers = options.layers;
  if (options.context < 0 || options.context > (1 << 24))
    throw Error("synth: --context " + std::to_string(options.context) + " is out of range 1..16777216");
  if (options.context > 0) preset.context_length = options.context;

  GGUFWriter writer;
  write_model_metadata(writer, preset, preset.n_layers, options.seed);
  write_vocab_metadata(writer, build_synth_vocab(preset.vocab_size, preset.arch == "phi3"));
  if (!options.chat_template.empty()) writer.set_string("tokenizer.chat_template", options.chat_template);

  ModelSynthesizer synth(writer, options.type, options.seed);
  synth.matrix("token_embd.weight", preset.dim, preset.vocab_size);
  for (int layer = 0; layer < preset.n_layers; ++layer) add_block(synth, preset, layer);
  synth.ones("output_norm.weight", preset.dim);
  if (preset.llama3_rope_factor > 0)
    writer.add_f32_tensor("rope_freqs.weight", {preset.head_dim() / 2},
                          llama3_rope_freq_factors(preset.head_dim(), preset.rope_theta, preset.llama3_rope_factor));
  if (!preset.tied_embeddings) synth.matrix("output.weight", preset.dim, preset.vocab_size);
  writer.write(options.output_path);
}

}  // namespace kvserve

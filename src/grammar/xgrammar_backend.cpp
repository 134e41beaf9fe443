#include "grammar/xgrammar_backend.h"

#include <limits>
#include <optional>
#include <string>
#include <vector>

#if KVSERVE_HAVE_XGRAMMAR
#include <xgrammar/xgrammar.h>
#endif

namespace kvserve {

#if KVSERVE_HAVE_XGRAMMAR
namespace {

// One sequence's xgrammar matcher; the token bitmask of the current state is
// filled once and reused by mask() and finished().
class XGrammarMatcher final : public TokenMatcher {
 public:
  XGrammarMatcher(const xgrammar::CompiledGrammar& grammar, std::shared_ptr<const std::vector<bool>> stop_ids,
                  int32_t vocab_size)
      // -1: unlimited rollback (a speculative round undoes up to draft_k tokens).
      : matcher_(grammar, std::nullopt, false, -1), stop_ids_(std::move(stop_ids)),
        bitmask_(static_cast<size_t>(xgrammar::GetBitmaskSize(vocab_size))), vocab_size_(vocab_size) {}

  void mask(std::span<float> logits) override {
    fill();
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    const size_t covered = std::min(logits.size(), static_cast<size_t>(vocab_size_));
    for (size_t word = 0; word * 32 < covered; ++word) {
      const auto bits = static_cast<uint32_t>(bitmask_[word]);
      if (bits == ~uint32_t{0}) continue;
      const size_t end = std::min(covered, word * 32 + 32);
      for (size_t id = word * 32; id < end; ++id)
        if (((bits >> (id - word * 32)) & 1u) == 0) logits[id] = kMasked;
    }
    for (size_t id = covered; id < logits.size(); ++id) logits[id] = kMasked;
  }

  bool accept(int32_t token) override {
    if (token < 0 || token >= vocab_size_ || !matcher_.AcceptToken(token)) return false;
    filled_ = false;
    return true;
  }

  void rollback(int32_t n) override {
    if (n <= 0) return;
    matcher_.Rollback(n);
    filled_ = false;
  }

  bool finished() override {
    if (matcher_.IsTerminated()) return true;
    if (!matcher_.IsCompleted()) return false;
    fill();
    for (size_t word = 0; word < bitmask_.size(); ++word) {
      auto bits = static_cast<uint32_t>(bitmask_[word]);
      while (bits != 0) {
        const size_t id = word * 32 + static_cast<size_t>(__builtin_ctz(bits));
        bits &= bits - 1;
        if (id < stop_ids_->size() && !(*stop_ids_)[id]) return false;
      }
    }
    return true;
  }

 private:
  void fill() {
    if (filled_) return;
    int64_t shape = static_cast<int64_t>(bitmask_.size());
    DLTensor tensor{};
    tensor.data = bitmask_.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 1;
    tensor.dtype = xgrammar::GetBitmaskDLType();
    tensor.shape = &shape;
    matcher_.FillNextTokenBitmask(&tensor);
    filled_ = true;
  }

  xgrammar::GrammarMatcher matcher_;
  std::shared_ptr<const std::vector<bool>> stop_ids_;
  std::vector<int32_t> bitmask_;  // bit i of word i / 32: token i may come next
  int32_t vocab_size_;
  bool filled_ = false;
};

class XGrammarConstraint final : public CompiledConstraint {
 public:
  XGrammarConstraint(xgrammar::CompiledGrammar grammar, std::shared_ptr<const std::vector<bool>> stop_ids,
                     int32_t vocab_size)
      : grammar_(std::move(grammar)), stop_ids_(std::move(stop_ids)), vocab_size_(vocab_size) {}
  std::unique_ptr<TokenMatcher> new_matcher() const override {
    return std::make_unique<XGrammarMatcher>(grammar_, stop_ids_, vocab_size_);
  }
  // The grammar and its token-mask cache (the vocabulary is shared by all).
  size_t memory_bytes() const override { return sizeof(*this) + grammar_.MemorySizeBytes(); }

 private:
  xgrammar::CompiledGrammar grammar_;
  std::shared_ptr<const std::vector<bool>> stop_ids_;
  int32_t vocab_size_;
};

// A string literal of xgrammar's EBNF: printable ASCII as is, quotes and
// backslashes escaped, control bytes as \xHH, UTF-8 sequences kept.
std::string ebnf_literal(const std::string& text) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// xgrammar's messages start with "[hh:mm:ss] /path/file.cc:123: ": keep what follows.
std::string user_message(const std::string& what) {
  std::string out = what;
  if (const size_t source = out.find(".cc:"); !out.empty() && out[0] == '[' && source != std::string::npos)
    if (const size_t colon = out.find(": ", source); colon != std::string::npos) out = out.substr(colon + 2);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string choice_grammar(const std::vector<std::string>& choices) {
  std::string grammar = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) grammar += (i ? " | " : "") + ebnf_literal(choices[i]);
  return grammar;
}

}  // namespace

struct XGrammarBackend::State {
  State(xgrammar::TokenizerInfo info, int threads, std::shared_ptr<const std::vector<bool>> stop_ids, int32_t vocab)
      // Our own cache (ConstraintCompiler) keeps compiled grammars: xgrammar's stays off.
      : compiler(std::move(info), threads, false), stop_ids(std::move(stop_ids)), vocab_size(vocab) {}
  xgrammar::GrammarCompiler compiler;
  std::shared_ptr<const std::vector<bool>> stop_ids;
  int32_t vocab_size;
};

bool xgrammar_available() { return true; }

XGrammarBackend::XGrammarBackend(const Tokenizer& tokenizer, int32_t vocab_size, int threads) {
  // Each token as the bytes it decodes to (xgrammar's RAW vocabulary); control
  // tokens decode to "" and are never allowed except as stop tokens.
  std::vector<std::string> vocab(static_cast<size_t>(vocab_size));
  auto stop_ids = std::make_shared<std::vector<bool>>(static_cast<size_t>(vocab_size), false);
  std::vector<int32_t> stops;
  for (int32_t id = 0; id < std::min(vocab_size, tokenizer.vocab_size()); ++id) {
    vocab[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
    if (tokenizer.is_end_of_generation(id)) {
      stops.push_back(id);
      (*stop_ids)[static_cast<size_t>(id)] = true;
    }
  }
  try {
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, vocab_size, stops, false);
    state_ = std::make_unique<State>(std::move(info), std::max(1, threads), std::move(stop_ids), vocab_size);
  } catch (const std::exception& e) {
    throw ConstraintError(ConstraintError::Reason::kUnavailable,
                          "xgrammar could not index this model's vocabulary: " + user_message(e.what()));
  }
}

XGrammarBackend::~XGrammarBackend() = default;

std::shared_ptr<const CompiledConstraint> XGrammarBackend::compile(const ConstraintSpec& spec) {
  xgrammar::GrammarCompiler& c = state_->compiler;
  try {
    std::optional<xgrammar::CompiledGrammar> grammar;
    switch (spec.kind) {
      // Compact JSON (", " and ": ", no free whitespace): small models given
      // free whitespace tend to emit newlines until max_tokens.
      case ConstraintKind::kJsonObject:
        grammar = c.CompileJSONSchema(R"({"type": "object"})", false, std::nullopt, std::nullopt, false);
        break;
      case ConstraintKind::kJsonSchema:
        grammar = c.CompileJSONSchema(spec.text, false, std::nullopt, std::nullopt, true);
        break;
      case ConstraintKind::kRegex: grammar = c.CompileRegex(spec.text); break;
      case ConstraintKind::kChoice: grammar = c.CompileGrammar(choice_grammar(spec.choices), "root"); break;
      case ConstraintKind::kGrammar: grammar = c.CompileGrammar(spec.text, "root"); break;
      case ConstraintKind::kStructuralTag: grammar = c.CompileStructuralTag(spec.text); break;
    }
    return std::make_shared<XGrammarConstraint>(std::move(*grammar), state_->stop_ids, state_->vocab_size);
  } catch (const std::exception& e) {  // xgrammar reports every bad input as a std::runtime_error subclass
    throw ConstraintError(ConstraintError::Reason::kInvalid,
                          std::string("invalid ") + constraint_kind_name(spec.kind) + ": " + user_message(e.what()));
  }
}

#else  // built without xgrammar

struct XGrammarBackend::State {};

bool xgrammar_available() { return false; }

XGrammarBackend::XGrammarBackend(const Tokenizer&, int32_t, int) {
  throw ConstraintError(ConstraintError::Reason::kUnavailable,
                        "structured outputs need kvserve built with xgrammar (run scripts/build_xgrammar.sh, then "
                        "configure the build again)");
}

XGrammarBackend::~XGrammarBackend() = default;

std::shared_ptr<const CompiledConstraint> XGrammarBackend::compile(const ConstraintSpec&) {
  throw ConstraintError(ConstraintError::Reason::kUnavailable, "structured outputs need kvserve built with xgrammar");
}

#endif

}  // namespace kvserve

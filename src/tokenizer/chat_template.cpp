// Rendering chat templates: runs the statements and evaluates the
// expressions of the AST from chat_template_parse.cpp, the way Jinja (with
// Hugging Face's settings) would; what values do is chat_template_values.cpp
// (operators) and chat_template_filters.cpp (methods, filters, tests).
#include "tokenizer/chat_template.h"

#include <ctime>

#include "core/error.h"
#include "model/gguf.h"
#include "tokenizer/chat_template_ast.h"
#include "tokenizer/chat_template_filters.h"
#include "tokenizer/chat_template_values.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

using namespace chat_template_detail;

struct ChatTemplate::Program {
  std::string source;
  std::vector<Node> nodes;
};

namespace {

const char* const kChatMlSource =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Gemma's turn format (the template Gemma 3's instruction-tuned files carry,
// without its image handling): a system message goes before the first user
// turn, the assistant's role is "model".
const char* const kGemmaSource =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + "
    "'\n\n' %}{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}"
    "{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

class Renderer {
 public:
  Renderer(json globals, size_t max_work_bytes) : work_(max_work_bytes) { scopes_.push_back(std::move(globals)); }

  std::string run(const std::vector<Node>& nodes) {
    exec(nodes);
    return std::move(out_);
  }

 private:
  void exec(const std::vector<Node>& nodes) {
    for (const Node& n : nodes) {
      work_.charge(kStepCost);
      switch (n.kind) {
        case Node::Kind::kText: emit(n.text); break;
        case Node::Kind::kOutput: emit(to_text(eval(*n.expr))); break;
        case Node::Kind::kIf: exec_if(n); break;
        case Node::Kind::kFor: exec_for(n); break;
        case Node::Kind::kSet: exec_set(n); break;
      }
    }
  }

  void emit(const std::string& text) {
    if (out_.size() + text.size() > kMaxTextBytes)
      fail("the output would exceed " + std::to_string(kMaxTextBytes >> 20) + " MiB");
    out_ += text;
  }

  // Every loop iteration (and range() item) counts against one budget, so
  // nested loops cannot multiply into hours.
  void count_iterations(int64_t n) {
    iterations_ += n;
    if (iterations_ > kMaxLoopIterations)
      fail("loops ran more than " + std::to_string(kMaxLoopIterations) + " iterations in all");
  }

  // Fails before a loop of `count` more iterations starts (or its items are made).
  void check_iterations(size_t count) const {
    if (count > static_cast<size_t>(kMaxLoopIterations - iterations_))
      fail("loops ran more than " + std::to_string(kMaxLoopIterations) + " iterations in all");
  }

  // Charges a value just produced against the work budget: every evaluation
  // copies its result, so a loop over a large value costs its size each time.
  void account(const json& v) { work_.charge(kStepCost + footprint(v, 0)); }

  void exec_if(const Node& n) {
    for (size_t i = 0; i < n.bodies.size(); ++i) {
      if (i == n.conditions.size() || truthy(eval(*n.conditions[i]))) {
        exec(n.bodies[i]);
        return;
      }
    }
  }

  // The items a {% for %} visits, counted against the loop limit before they
  // are made: a string of 64 MiB would otherwise become 64 M strings first.
  std::vector<json> iteration_items(const Node& n) {
    const json seq = eval(*n.expr);
    if (!seq.is_structured() && !seq.is_string() && !is_undefined(seq) && !seq.is_null())
      fail("cannot loop over a " + std::string(seq.type_name()));
    const size_t count = seq.is_string() ? seq.get_ref<const std::string&>().size() : seq.is_structured() ? seq.size() : 0;
    check_iterations(count);
    std::vector<json> all;
    all.reserve(count);
    if (seq.is_object()) for (auto it = seq.begin(); it != seq.end(); ++it) all.push_back(it.key());
    else if (seq.is_array()) all.assign(seq.begin(), seq.end());
    else if (seq.is_string()) {
      work_.charge(count * (kStepCost + kValueBytes + kStringBytes));
      for (char c : seq.get_ref<const std::string&>()) all.push_back(std::string(1, c));
    }
    if (!n.conditions[0]) return all;
    std::vector<json> kept;
    count_iterations(static_cast<int64_t>(all.size()));
    for (json& item : all) {
      scopes_.push_back(json::object());
      bind_loop_variables(n, item);
      if (truthy(eval(*n.conditions[0]))) kept.push_back(std::move(item));
      scopes_.pop_back();
    }
    return kept;
  }

  void bind_loop_variables(const Node& n, const json& item) {
    if (n.names.size() == 1) {
      scopes_.back()[n.names[0]] = item;
      return;
    }
    if (!item.is_array() || item.size() != n.names.size()) fail("cannot unpack a loop item into " + std::to_string(n.names.size()) + " names");
    for (size_t i = 0; i < n.names.size(); ++i) scopes_.back()[n.names[i]] = item[i];
  }

  void exec_for(const Node& n) {
    const std::vector<json> items = iteration_items(n);
    const auto count = static_cast<int64_t>(items.size());
    count_iterations(count);
    for (int64_t i = 0; i < count; ++i) {
      scopes_.push_back(json::object());
      bind_loop_variables(n, items[static_cast<size_t>(i)]);
      scopes_.back()["loop"] = {{"index", i + 1}, {"index0", i}, {"first", i == 0}, {"last", i + 1 == count},
                                {"length", count}, {"revindex", count - i}, {"revindex0", count - i - 1}};
      exec(n.bodies[0]);
      scopes_.pop_back();
    }
    if (count == 0) exec(n.bodies[1]);
  }

  void exec_set(const Node& n) {
    json value = eval(*n.expr);
    if (n.names.size() == 1) {
      scopes_.back()[n.names[0]] = std::move(value);
      return;
    }
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      if (!scope->contains(n.names[0])) continue;
      json& target = (*scope)[n.names[0]];
      if (!target.is_object()) fail("cannot set an attribute of '" + n.names[0] + "'");
      target[n.names[1]] = std::move(value);
      account(target);  // ns.a = ns nests ns one level deeper each time
      return;
    }
    fail("'" + n.names[0] + "' is undefined");
  }

  json lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto it = scope->find(name);
      if (it != scope->end()) return *it;
    }
    return undefined();
  }

  json eval(const Expr& e) {
    json value = evaluate(e);
    account(value);
    return value;
  }

  json evaluate(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kAttr: {
        const json obj = eval(*e.args[0]);
        return obj.is_object() ? subscript(obj, e.name) : undefined();
      }
      case Expr::Kind::kIndex: return subscript(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::kSlice:
        return slice(eval(*e.args[0]), optional(e.args[1]), optional(e.args[2]), optional(e.args[3]));
      case Expr::Kind::kCall: return eval_call(e);
      case Expr::Kind::kFilter: return apply_filter(e.name, eval(*e.args[0]), eval_args(e), work_);
      case Expr::Kind::kTest: return apply_test(e.name, eval(*e.args[0]));
      case Expr::Kind::kNot: return !truthy(eval(*e.args[0]));
      case Expr::Kind::kNeg: return arithmetic("-", 0, eval(*e.args[0]));
      case Expr::Kind::kBinary: return eval_binary(e);
      case Expr::Kind::kList: return eval_list(e);
      case Expr::Kind::kDict: return eval_dict(e);
      case Expr::Kind::kIf:
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : undefined();
    }
    fail("unknown expression");
  }

  json optional(const ExprPtr& e) { return e ? eval(*e) : undefined(); }

  json eval_list(const Expr& e) {
    json out = json::array();
    for (const ExprPtr& item : e.args) out.push_back(eval(*item));
    return out;
  }

  json eval_dict(const Expr& e) {
    json out = json::object();
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) out[as_string(eval(*e.args[i]), "dict key")] = eval(*e.args[i + 1]);
    return out;
  }

  json eval_binary(const Expr& e) {
    const std::string& op = e.name;
    json left = eval(*e.args[0]);
    if (op == "and") return truthy(left) ? eval(*e.args[1]) : left;
    if (op == "or") return truthy(left) ? left : eval(*e.args[1]);
    const json right = eval(*e.args[1]);
    if (op == "~") {
      check_text_size(text_size(left) + text_size(right), "'~'");
      return to_text(left) + to_text(right);
    }
    if (op == "+" || op == "-" || op == "*" || op == "/" || op == "//" || op == "%") return arithmetic(op, left, right);
    return compare(op, left, right, work_);
  }

  // Arguments after the first (the callee or the filtered value).
  std::vector<json> eval_args(const Expr& e) {
    std::vector<json> out;
    for (size_t i = 1; i < e.args.size(); ++i) out.push_back(eval(*e.args[i]));
    return out;
  }

  json eval_call(const Expr& e) {
    const Expr& callee = *e.args[0];
    std::vector<json> args = eval_args(e);
    if (callee.kind == Expr::Kind::kAttr) return call_method(eval(*callee.args[0]), callee.name, args, work_);
    if (callee.kind != Expr::Kind::kName) fail("this value cannot be called");
    const std::string& fn = callee.name;
    if (fn == "raise_exception") fail(args.empty() ? "raise_exception()" : to_text(args[0]).substr(0, kMaxErrorBytes));
    if (fn == "namespace" || fn == "dict") {
      json out = json::object();
      for (size_t i = 0; i < args.size(); ++i)
        if (!e.keywords[i].empty()) out[e.keywords[i]] = args[i];
      return out;
    }
    if (fn == "range") return range(args);
    if (fn == "strftime_now") {
      char buf[128];
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      const std::string format = as_string(args.empty() ? undefined() : args[0], "strftime_now");  // a copy: the ?: is a temporary
      return std::string(buf, std::strftime(buf, sizeof buf, format.c_str(), &tm));
    }
    fail("unknown function '" + fn + "'");
  }

  static json range(const std::vector<json>& a) {
    if (a.empty() || a.size() > 2) fail("range takes one or two arguments");
    const int64_t from = a.size() == 2 ? as_int(a[0], "range") : 0, to = as_int(a.back(), "range");
    int64_t count = 0;
    if (__builtin_sub_overflow(to, from, &count) || count > kMaxLoopIterations)
      fail("range() of more than " + std::to_string(kMaxLoopIterations) + " numbers");
    json out = json::array();
    for (int64_t i = from; i < to; ++i) out.push_back(i);
    return out;
  }

  std::vector<json> scopes_;  // innermost last; every scope is a JSON object
  std::string out_;
  int64_t iterations_ = 0;  // loop iterations so far, against kMaxLoopIterations
  WorkBudget work_;
};

}  // namespace

ChatTemplate ChatTemplate::parse(std::string_view source) {
  auto program = std::make_shared<Program>();
  program->source = std::string(source);
  program->nodes = parse_template(source);
  return ChatTemplate(std::move(program));
}

ChatTemplate ChatTemplate::chatml() { return parse(kChatMlSource); }

ChatTemplate ChatTemplate::gemma() { return parse(kGemmaSource); }

ChatTemplate ChatTemplate::for_model(const GGUFFile& file, std::string* note) {
  const std::string key = "tokenizer.chat_template";
  auto say = [&](const std::string& text) {
    if (note) *note = text;
  };
  if (!file.has(key)) {
    // A Gemma file without a template (the base models) still knows Gemma's
    // turn tokens; ChatML's would be plain text to it.
    if (file.get_string("general.architecture", "").starts_with("gemma")) {
      say("the model has no " + key + "; using Gemma's turn format");
      return gemma();
    }
    say("the model has no " + key + "; using ChatML");
    return chatml();
  }
  try {
    ChatTemplate t = parse(file.get_string(key));
    // A dry run catches templates that parse but use what apply() lacks.
    ChatTemplateInputs probe;
    probe.messages = json::array({{{"role", "user"}, {"content", "hello"}}});
    t.apply(probe);
    say("using the model's " + key);
    return t;
  } catch (const Error& e) {
    say(std::string("the model's ") + key + " is not supported (" + e.what() + "); using ChatML");
    return chatml();
  }
}

std::string ChatTemplate::apply(const ChatTemplateInputs& inputs) const {
  json globals = {{"messages", inputs.messages},
                  {"add_generation_prompt", inputs.add_generation_prompt},
                  {"bos_token", inputs.bos_token},
                  {"eos_token", inputs.eos_token},
                  {"tools", inputs.tools}};
  if (inputs.variables.is_object())
    for (const auto& [name, value] : inputs.variables.items())
      if (!globals.contains(name)) globals[name] = value;
  return Renderer(std::move(globals), inputs.max_work_bytes ? inputs.max_work_bytes : kMaxWorkBytes).run(program_->nodes);
}

const std::string& ChatTemplate::source() const { return program_->source; }

void set_special_tokens(ChatTemplateInputs& inputs, const Tokenizer& tokenizer) {
  inputs.bos_token = tokenizer.bos_id() >= 0 ? tokenizer.piece(tokenizer.bos_id()) : "";
  inputs.eos_token = tokenizer.eos_id() >= 0 ? tokenizer.piece(tokenizer.eos_id()) : "";
}

std::vector<int32_t> encode_rendered_prompt(const Tokenizer& tokenizer, const ChatTemplateInputs& inputs,
                                            const std::string& rendered) {
  const bool has_bos = !inputs.bos_token.empty() && rendered.rfind(inputs.bos_token, 0) == 0;
  return tokenizer.encode(rendered, tokenizer.add_bos() && !has_bos);
}

}  // namespace kvserve

// Grammar compiles a client cannot turn against the server (issue 31): the
// caps on a spec's numbers (a 400 naming the JSON pointer), compile slots that
// compiles past their timeout give up, and a cache bounded in bytes.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/constraint_compiler.h"
#include "grammar/repetition_scan.h"
#include "grammar/spec_limits.h"
#include "grammar/xgrammar_backend.h"
#include "server/constraint_param.h"
#include "server_harness.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

// The message of check_spec_limits' refusal, or "ok".
std::string refusal(ConstraintKind kind, const std::string& text, const ConstraintLimits& limits = {}) {
  try {
    check_spec_limits({kind, text, {}}, limits);
  } catch (const ConstraintError& e) {
    EXPECT_EQ(e.reason(), ConstraintError::Reason::kTooLarge);
    return e.what();
  }
  return "ok";
}

std::string schema_refusal(const json& schema) { return refusal(ConstraintKind::kJsonSchema, schema.dump()); }

json nested_arrays(int levels) {
  json schema = {{"type", "integer"}};
  for (int i = 0; i < levels; ++i) schema = {{"type", "array"}, {"items", schema}};
  return schema;
}

}  // namespace

TEST(GrammarLimits, EachSchemaCapNamesItsPointer) {
  const json string_prop = {{"type", "string"}, {"maxLength", 100000000}};
  EXPECT_EQ(schema_refusal({{"type", "object"}, {"properties", {{"a", string_prop}}}}),
            "/properties/a/maxLength is 100000000, at most 100000");
  EXPECT_EQ(schema_refusal({{"type", "string"}, {"minLength", 200000}}), "/minLength is 200000, at most 100000");
  EXPECT_EQ(schema_refusal({{"type", "array"}, {"items", {{"type", "array"}, {"minItems", 1e9}}}}),
            "/items/minItems is 1000000000.0, at most 100000");
  EXPECT_EQ(schema_refusal({{"type", "array"}, {"maxItems", 100001}}), "/maxItems is 100001, at most 100000");
  EXPECT_EQ(schema_refusal({{"anyOf", {{{"type", "object"}, {"minProperties", 5000}}}}}),
            "/anyOf/0/minProperties is 5000, at most 1000");
  EXPECT_EQ(schema_refusal({{"$defs", {{"a/b", {{"type", "object"}, {"maxProperties", 2000}}}}}}),
            "/$defs/a~1b/maxProperties is 2000, at most 1000");
  EXPECT_EQ(schema_refusal({{"type", "array"}, {"maxContains", 999999}}), "/maxContains is 999999, at most 100000");
  EXPECT_EQ(schema_refusal({{"type", "string"}, {"pattern", "(a{1000}){1000}"}}),
            "/pattern: {1000} at offset 2 repeats 1000 times, at most 256");
  EXPECT_EQ(schema_refusal({{"type", "object"}, {"patternProperties", {{"^x{99999}$", {{"type", "string"}}}}}}),
            "/patternProperties/^x{99999}$: {99999} at offset 2 repeats 99999 times, at most 256");
  EXPECT_NE(schema_refusal(nested_arrays(40)).find("schemas nest deeper than 32 levels"), std::string::npos);
  json many = json::object();
  for (int i = 0; i < 5001; ++i) many["p" + std::to_string(i)] = {{"type", "integer"}};
  EXPECT_EQ(schema_refusal({{"type", "object"}, {"properties", many}}),
            "/properties: the schema has more than 5000 properties in all");
  // The positions of counted repetitions add up over the schema's patterns.
  const json pattern = {{"type", "string"}, {"pattern", ".{1,200}"}};
  EXPECT_EQ(schema_refusal({{"type", "object"}, {"properties", {{"a", pattern}, {"b", pattern}}}}),
            "/properties/b/pattern: {1,200} at offset 1 brings the positions of counted repetitions to 400, at most 256");
  // Within the caps, and data that only looks like a keyword (an enum value, a property named maxLength).
  EXPECT_EQ(schema_refusal({{"type", "string"}, {"maxLength", 100000}, {"pattern", "[a-z]{1,256}"}}), "ok");
  EXPECT_EQ(schema_refusal({{"enum", {{{"maxLength", 1e12}}}}, {"default", {{"minItems", 1e12}}}}), "ok");
  EXPECT_EQ(schema_refusal({{"type", "object"}, {"properties", {{"maxLength", {{"type", "integer"}}}}}}), "ok");
  EXPECT_EQ(schema_refusal(nested_arrays(30)), "ok");
  EXPECT_EQ(refusal(ConstraintKind::kJsonSchema, std::string(200, '[') + std::string(200, ']')),
            "the JSON nests deeper than 128 levels");
}

TEST(GrammarLimits, RegexGrammarAndStructuralTagCounts) {
  EXPECT_EQ(refusal(ConstraintKind::kRegex, "[0-9]{3}-(ab|c){2,10001}"),
            "{2,10001} at offset 15 repeats 10001 times, at most 256");
  EXPECT_EQ(refusal(ConstraintKind::kRegex, "((a{10}b){10}){10}"),
            "{10} at offset 14 brings the positions of counted repetitions to 1220, at most 256");
  EXPECT_EQ(refusal(ConstraintKind::kRegex, "x{,99999}"), "{,99999} at offset 1 repeats 99999 times, at most 256");
  EXPECT_EQ(refusal(ConstraintKind::kRegex, std::string(40, '(') + "a" + std::string(40, ')')),
            "groups nest deeper than 32 levels at offset 32");
  // Braces that are not counts: escaped, in a class, a literal brace, \u{...}.
  EXPECT_EQ(refusal(ConstraintKind::kRegex, R"(\{99999\}[{99999}]a{b}\u{1F600}\p{L})"), "ok");
  EXPECT_EQ(refusal(ConstraintKind::kRegex, "(a{15}){15}"), "ok");  // 15 * 15 + 15 positions
  EXPECT_EQ(refusal(ConstraintKind::kGrammar, "root ::= (\"a\"{100}){20}"),
            "{20} at offset 19 brings the positions of counted repetitions to 2100, at most 256");
  EXPECT_EQ(refusal(ConstraintKind::kGrammar, "root ::= \"{99999}\" [{99999}] # x{99999}\n"), "ok");
  const json tag = {{"type", "structural_tag"},
                    {"format", {{"type", "sequence"},
                                {"elements", {{{"type", "regex"}, {"pattern", "a{50000}"}}}}}}};
  EXPECT_EQ(refusal(ConstraintKind::kStructuralTag, tag.dump()),
            "/format/elements/0/pattern: {50000} at offset 1 repeats 50000 times, at most 256");
  const json schema_tag = {
      {"type", "structural_tag"},
      {"format", {{"type", "tag"}, {"begin", "<a>"}, {"end", "</a>"},
                  {"content", {{"type", "json_schema"}, {"json_schema", {{"type", "string"}, {"maxLength", 1e6}}}}}}}};
  EXPECT_EQ(refusal(ConstraintKind::kStructuralTag, schema_tag.dump()),
            "/format/content/json_schema/maxLength is 1000000.0, at most 100000");
  ConstraintLimits small;
  small.max_spec_bytes = 8;
  EXPECT_NE(refusal(ConstraintKind::kRegex, "[0-9]+[a-z]+", small).find("at most 8"), std::string::npos);
}

// A schema sent as text with a 100000-member object: parsed and checked in
// linear time (nlohmann's depth callback rescans the object per member: minutes).
TEST(GrammarLimits, LargeSchemaTextIsParsedInLinearTime) {
  std::string properties;
  for (int i = 0; i < 100000; ++i) properties += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": {}";
  const std::string schema = R"({"type": "object", "properties": {)" + properties + "}}";
  const auto start = std::chrono::steady_clock::now();
  const auto parsed = server::parse_constraint(json{{"guided_json", schema}});
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(refusal(ConstraintKind::kJsonSchema, schema),
            "the json_schema has " + std::to_string(schema.size()) + " bytes; this server compiles at most 262144");
  ConstraintLimits roomy;
  roomy.max_spec_bytes = 4 << 20;
  EXPECT_EQ(refusal(ConstraintKind::kJsonSchema, schema, roomy), "/properties: the schema has more than 5000 properties in all");
  // 3.4 s on a loaded 2-core host, 25 s unoptimized under ASan beside two other tests; quadratic took many minutes.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(150));
}

namespace {

// A compile function whose specs named "slow..." block until released.
class HeldCompiles {
 public:
  std::shared_ptr<const CompiledConstraint> compile(const ConstraintSpec& spec) {
    std::unique_lock lock(mutex_);
    if (spec.text.rfind("slow", 0) == 0) released_.wait(lock, [&] { return released_flag_; });
    return std::make_shared<Constant>(spec.text.size() * 1000);
  }
  void release() {
    std::lock_guard lock(mutex_);
    released_flag_ = true;
    released_.notify_all();
  }

 private:
  class Constant final : public CompiledConstraint {
   public:
    explicit Constant(size_t bytes) : bytes_(bytes) {}
    std::unique_ptr<TokenMatcher> new_matcher() const override { return nullptr; }
    size_t memory_bytes() const override { return bytes_; }

   private:
    size_t bytes_;
  };
  std::mutex mutex_;
  std::condition_variable released_;
  bool released_flag_ = false;
};

ConstraintCompiler held_compiler(const std::shared_ptr<HeldCompiles>& held, ConstraintLimits limits) {
  return ConstraintCompiler([held](const ConstraintSpec& s) { return held->compile(s); }, limits);
}

ConstraintError::Reason failure(ConstraintCompiler& compiler, const std::string& text) {
  try {
    compiler.compile({ConstraintKind::kRegex, text, {}});
  } catch (const ConstraintError& e) {
    return e.reason();
  }
  ADD_FAILURE() << "no error for " << text;
  return ConstraintError::Reason::kInvalid;
}

}  // namespace

TEST(GrammarCompileSlots, StuckCompilesGiveUpTheirSlotsUpToABound) {
  auto held = std::make_shared<HeldCompiles>();
  ConstraintLimits limits;
  limits.compile_timeout_seconds = 0.3;
  ConstraintCompiler compiler = held_compiler(held, limits);  // 4 slots, 4 overdue
  // Four compiles that never end (until released) take every slot, and time out.
  std::vector<std::future<ConstraintError::Reason>> slow;
  for (int i = 0; i < 4; ++i)
    slow.push_back(std::async(std::launch::async, [&, i] { return failure(compiler, "slow" + std::to_string(i)); }));
  for (auto& f : slow) EXPECT_EQ(f.get(), ConstraintError::Reason::kTimeout);
  // Past their timeout they hold no slot: a fifth, quick spec compiles.
  EXPECT_NE(compiler.compile({ConstraintKind::kRegex, "quick", {}}), nullptr);
  // Four more stuck ones fill the overdue bound: then a new spec is refused at once, busy.
  for (int i = 4; i < 8; ++i) EXPECT_EQ(failure(compiler, "slow" + std::to_string(i)), ConstraintError::Reason::kTimeout);
  EXPECT_EQ(compiler.stats().running, 8);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(failure(compiler, "another"), ConstraintError::Reason::kBusy);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250));
  // A cached spec is still served, and the stuck compiles land in the cache when they end.
  EXPECT_NE(compiler.compile({ConstraintKind::kRegex, "quick", {}}), nullptr);
  held->release();
  for (int i = 0; i < 500 && compiler.stats().running > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(compiler.stats().running, 0);
  const int64_t compiles = compiler.stats().compiles;
  EXPECT_NE(compiler.compile({ConstraintKind::kRegex, "slow0", {}}), nullptr);
  EXPECT_EQ(compiler.stats().compiles, compiles);  // from the cache
}

TEST(GrammarCompileCache, BoundedInBytesAndNotBlockedByAnUnfinishedEntry) {
  auto held = std::make_shared<HeldCompiles>();
  ConstraintLimits limits;
  limits.compile_timeout_seconds = 0.2;
  limits.max_cache_bytes = 64 * 1000;  // a spec of n bytes is n * 1000 bytes compiled, here
  ConstraintCompiler compiler = held_compiler(held, limits);
  EXPECT_EQ(failure(compiler, "slow, first in the cache"), ConstraintError::Reason::kTimeout);
  for (int i = 0; i < 200; ++i) {
    ASSERT_NE(compiler.compile({ConstraintKind::kRegex, "spec " + std::to_string(i), {}}), nullptr);
    const ConstraintCompilerStats stats = compiler.stats();
    EXPECT_LE(stats.cached_bytes, limits.max_cache_bytes);
    EXPECT_LE(stats.cached, 64 * 1000 / 5000 + 2);  // the unfinished entry stays, the rest rotate
  }
  // Recently used entries stay; the least recently used go first.
  compiler.compile({ConstraintKind::kRegex, "spec 199", {}});
  for (int i = 200; i < 205; ++i) compiler.compile({ConstraintKind::kRegex, "spec " + std::to_string(i), {}});
  const int64_t compiles = compiler.stats().compiles;
  compiler.compile({ConstraintKind::kRegex, "spec 199", {}});
  EXPECT_EQ(compiler.stats().compiles, compiles);
  held->release();
  for (int i = 0; i < 500 && compiler.stats().running > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_LE(compiler.stats().cached_bytes, limits.max_cache_bytes);
}

TEST(GrammarCompileCache, XGrammarConstraintsReportTheirSize) {
  if (!xgrammar_available()) GTEST_SKIP() << "built without xgrammar";
  test_util::SynthModel synth;
  ConstraintCompiler unbounded(*synth.tokenizer, synth.model->config().vocab_size);
  const auto one = unbounded.compile({ConstraintKind::kJsonSchema, R"({"type": "object", "properties": {"k": {"type": "string"}}})", {}});
  EXPECT_GT(one->memory_bytes(), 1000u);  // the grammar and its token masks, not only the object
  ConstraintLimits limits;
  limits.max_cache_bytes = 8 * one->memory_bytes();
  ConstraintCompiler compiler(*synth.tokenizer, synth.model->config().vocab_size, limits);
  for (int i = 0; i < 60; ++i)
    compiler.compile({ConstraintKind::kJsonSchema,
                      json{{"type", "object"}, {"properties", {{"k" + std::to_string(i), {{"type", "string"}}}}}}.dump(),
                      {}});
  EXPECT_LE(compiler.stats().cached_bytes, limits.max_cache_bytes);
  EXPECT_LT(compiler.stats().cached, 61);
}

namespace {

class GrammarServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);
    synth_ = new test_util::SynthModel("tiny-llama");
  }
  static void TearDownTestSuite() { delete synth_; }
  void SetUp() override {
    if (!xgrammar_available()) GTEST_SKIP() << "built without xgrammar";
    server_ = std::make_unique<test_util::TestServer>(*synth_->model, *synth_->tokenizer);
  }
  httplib::Result post(const json& body, const std::string& path = "/v1/completions") const {
    return server_->client().Post(path.c_str(), body.dump(), "application/json");
  }
  static test_util::SynthModel* synth_;
  std::unique_ptr<test_util::TestServer> server_;
};
test_util::SynthModel* GrammarServer::synth_ = nullptr;

json schema_request(const json& schema) {
  return {{"prompt", "hi"}, {"max_tokens", 4},
          {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}}};
}

}  // namespace

TEST_F(GrammarServer, CapsAre400sNamingTheFieldAndThePointer) {
  const json props = {{"a", {{"type", "string"}, {"maxLength", 100000000}}}};
  auto r = post(schema_request({{"type", "object"}, {"properties", props}}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  const json error = json::parse(r->body)["error"];
  EXPECT_EQ(error["param"], "response_format.json_schema.schema");
  EXPECT_EQ(error["message"],
            "response_format.json_schema.schema: /properties/a/maxLength is 100000000, at most 100000");
  auto regex = post({{"prompt", "hi"}, {"max_tokens", 4}, {"structured_outputs", {{"regex", "(a{1000}){1000}"}}}});
  ASSERT_TRUE(regex);
  EXPECT_EQ(regex->status, 400);
  EXPECT_EQ(json::parse(regex->body)["error"]["param"], "structured_outputs.regex");
}

TEST(GrammarToolServer, ToolSchemaCapsAre400sNamingTheTool) {
  if (!xgrammar_available()) GTEST_SKIP() << "built without xgrammar";
  signal(SIGPIPE, SIG_IGN);
  test_util::SynthModel synth("smollm2-135m", 2);  // a context that holds the tools (the tiny presets' is 256)
  test_util::TestServer server(*synth.model, *synth.tokenizer);
  const json array = {{"type", "array"}, {"minItems", 1000000}};
  const json tool = {{"type", "function"},
                     {"function", {{"name", "f"}, {"parameters", {{"type", "object"}, {"properties", {{"x", array}}}}}}}};
  const json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}, {"tools", {tool}}};
  auto r = server.client().Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  const json error = json::parse(r->body)["error"];
  EXPECT_EQ(error["param"], "tools[0].function.parameters");
  EXPECT_EQ(error["message"], "tools[0].function.parameters: /properties/x/minItems is 1000000, at most 100000");
}

// The largest specs the caps accept, four at once: a fifth quick spec and a
// plain request are still served (the quick one compiled, or told busy).
TEST_F(GrammarServer, SlowAcceptedCompilesLeaveRoomForOthers) {
  const json dots = {{"type", "string"}, {"pattern", ".{1,128}"}};
  const std::vector<json> slow = {
      schema_request({{"type", "string"}, {"pattern", "(.{16}){15}"}}),
      schema_request({{"type", "object"}, {"properties", {{"a", dots}, {"b", dots}}}}),
      schema_request({{"type", "array"}, {"minItems", 100000},
                      {"items", {{"type", "array"}, {"minItems", 100000}, {"items", {{"type", "string"}, {"maxLength", 100000}}}}}}),
      {{"prompt", "hi"}, {"max_tokens", 4}, {"structured_outputs", {{"regex", ".{1,256}"}}}},
  };
  std::vector<std::future<int>> pending;
  for (const json& body : slow)
    pending.push_back(std::async(std::launch::async, [this, body] {
      auto r = post(body);
      return r ? r->status : -1;
    }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto quick = post({{"prompt", "hi"}, {"max_tokens", 4}, {"structured_outputs", {{"regex", "[0-9]{2}"}}}});
  ASSERT_TRUE(quick);
  EXPECT_TRUE(quick->status == 200 || quick->status == 503) << quick->status << " " << quick->body;
  if (quick->status == 503) {
    EXPECT_EQ(quick->get_header_value("Retry-After"), "1");
  }
  auto plain = post({{"prompt", "hi"}, {"max_tokens", 4}});
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 200);
  for (auto& p : pending) {
    const int status = p.get();
    EXPECT_TRUE(status == 200 || status == 400 || status == 503) << status;  // 400: a compile past its timeout
  }
}

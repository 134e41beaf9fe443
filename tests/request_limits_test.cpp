// Request bodies whose bytes fit the body limit but whose contents would not
// (issue 31): JSON trees that cost ~20x their text, prompt lists tokenized
// before they are counted, /tokenize and /detokenize without a token cap.
#include <gtest/gtest.h>

#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "server/api_error.h"
#include "server/json_input.h"
#include "server/request_parser.h"
#include "server_harness.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

constexpr size_t kBodyBytes = 16 << 20;  // the server's body limit

// The largest body the server reads, of `unit` repeated inside [...].
std::string repeated_array(const std::string& unit) {
  const std::string item = unit + ",";
  const size_t items = (kBodyBytes - unit.size() - 2) / item.size();
  std::string body = item;
  body.reserve(kBodyBytes);
  while (body.size() * 2 <= items * item.size()) body += body;  // doubling: fast even unoptimized
  body.append(body.data(), items * item.size() - body.size());
  return "[" + body + unit + "]";
}

// An object of as many distinct keys as fit the body limit.
std::string many_keys() {
  std::string body;
  body.reserve(kBodyBytes);
  body += "{";
  char key[32];
  for (int i = 0; body.size() < kBodyBytes - 64; ++i) body.append(key, std::snprintf(key, sizeof key, "\"%d\":0,", i));
  return body + "\"end\":0}";
}

// The hostile bodies, each the largest the server reads, each ~20-40x that as a tree.
std::vector<std::pair<std::string, std::function<std::string()>>> hostile_bodies() {
  const int levels = server::kMaxJsonDepth - 4;  // with the outer array, under the depth limit
  const std::string nested = std::string(levels, '[') + std::string(levels, ']');
  return {{"empty arrays", [] { return repeated_array("[]"); }},
          {"empty objects", [] { return repeated_array("{}"); }},
          {"nested arrays", [nested] { return repeated_array(nested); }},
          {"zeros", [] { return repeated_array("0"); }},
          {"short strings", [] { return repeated_array("\"\""); }},
          {"an object of many keys", many_keys}};
}

// Peak resident memory (VmHWM), in bytes; reset_peak() makes it the current RSS.
int64_t status_kib(const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(name + ":", 0) == 0) return std::stoll(line.substr(name.size() + 1));
  return -1;
}
// Freed heap memory is returned first, so that the parse must fault in what it takes.
bool reset_peak() {
  malloc_trim(0);
  return static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5");
}

// ASan keeps freed memory in quarantine and pads every allocation: RSS says nothing there.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMeasuresMemory = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kMeasuresMemory = false;
#else
constexpr bool kMeasuresMemory = true;
#endif
#else
constexpr bool kMeasuresMemory = true;
#endif

struct ParserFixture {
  test_util::SynthModel synth;
  ChatTemplate chat_template = ChatTemplate::chatml();
  int64_t context = synth.model->config().context_length;  // 256
  server::RequestParser parser{*synth.tokenizer, chat_template, context};
};

// The error a call throws, or a failed test.
template <typename F>
server::ApiError api_error_of(F f) {
  try {
    f();
  } catch (const server::ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError";
  return server::ApiError(0, "");
}

}  // namespace

// Each hostile body is refused with a 400 that names the limit, and the parse
// that refuses it grows the process by less than 64 MiB at its peak (they
// cost 350 MB and more as trees before the limits); the ordered_json parse
// that restores a schema's key order refuses them as well.
TEST(RequestLimits, HostileJsonBodiesAreRefusedWithinBoundedMemory) {
  const bool measured = kMeasuresMemory && reset_peak() && status_kib("VmHWM") > 0;
  for (const auto& [name, make_body] : hostile_bodies()) {
    SCOPED_TRACE(name);
    const std::string body = make_body();
    ASSERT_LE(body.size(), kBodyBytes);
    reset_peak();
    const int64_t before = status_kib("VmRSS");
    const server::ApiError e = api_error_of([&] { server::parse_json_body(body); });
    EXPECT_EQ(e.status(), 400);
    EXPECT_TRUE(std::string(e.what()).find("values") != std::string::npos ||
                std::string(e.what()).find("MiB as a JSON tree") != std::string::npos)
        << e.what();
    // (Unoptimized in this binary, where it takes seconds: two of the bodies.)
    if (name == "empty arrays" || name == "an object of many keys") {
      EXPECT_FALSE(server::parse_bounded_json<nlohmann::ordered_json>(body));
    }
    if (measured) {
      const int64_t growth_mib = (status_kib("VmHWM") - before) >> 10;
      EXPECT_LT(growth_mib, 64);
      std::printf("[ measured ] %-24s %5.1f MiB body: peak RSS +%lld MiB\n", name.c_str(), body.size() / 1048576.0,
                  static_cast<long long>(growth_mib));
    }
  }
}

// What real requests send still parses: a million token ids, a 15 MiB
// string, nesting to the depth limit.
TEST(RequestLimits, LargeButOrdinaryBodiesStillParse) {
  if (test_util::skip_slow()) GTEST_SKIP() << "a million values, slow unoptimized";
  std::string ids = "{\"prompt\": [";
  for (int i = 0; i < 1'000'000; ++i) ids += (i ? ",1" : "1");
  ids += "]}";
  EXPECT_EQ(server::parse_json_body(ids)["prompt"].size(), 1'000'000u);
  const json text = {{"prompt", std::string(15 << 20, 'a')}};
  EXPECT_EQ(server::parse_json_body(text.dump())["prompt"].get_ref<const std::string&>().size(), size_t{15} << 20);
  const std::string deep = std::string(server::kMaxJsonDepth, '[') + "1" + std::string(server::kMaxJsonDepth, ']');
  EXPECT_NO_THROW(server::parse_json_body(deep));
  EXPECT_EQ(api_error_of([&] { server::parse_json_body("[" + deep + "]"); }).status(), 400);
}

// ordered_json finds duplicate keys by walking the object: an object of many
// keys is refused before its parse turns quadratic (40,000 keys took 3.4 s);
// one of a few thousand keys keeps its order.
TEST(RequestLimits, OrderedParseOfManyKeysIsBounded) {
  auto object_of = [](int keys) {
    std::string text = "{";
    for (int i = 0; i < keys; ++i) text += (i ? ",\"" : "\"") + std::to_string(keys - i) + "\":0";
    return text + "}";
  };
  const auto few = server::parse_bounded_json<nlohmann::ordered_json>(object_of(4000));
  ASSERT_TRUE(few);
  EXPECT_EQ(few->begin().key(), "4000");
  EXPECT_FALSE(server::parse_bounded_json<nlohmann::ordered_json>(object_of(40000)));
  EXPECT_TRUE(server::parse_bounded_json<json>(object_of(40000)));  // std::map: no quadratic walk
}

// prompts x n is checked before any prompt is tokenized or its ids checked:
// the 17 prompts below would fail on their first invalid id otherwise.
TEST(RequestLimits, PromptsTimesNIsCheckedBeforeTokenizing) {
  ParserFixture f;
  json bad_ids = json::array();
  for (int i = 0; i < 17; ++i) bad_ids.push_back(json::array({1, 99999}));
  const server::ApiError e = api_error_of([&] { f.parser.parse(server::Endpoint::kCompletions, {{"prompt", bad_ids}}); });
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.param(), "n");
  EXPECT_NE(std::string(e.what()).find("17 x 1"), std::string::npos) << e.what();
  json four = json::array({"a", "b", "c", "d"});
  EXPECT_EQ(api_error_of([&] { f.parser.parse(server::Endpoint::kCompletions, {{"prompt", four}, {"n", 5}}); }).param(),
            "n");
  EXPECT_EQ(f.parser.parse(server::Endpoint::kCompletions, {{"prompt", four}, {"n", 4}}).choices(), 16u);
  // A token list longer than the context is refused before its ids are checked or decoded.
  const json long_ids = json::array({json(std::vector<int>(static_cast<size_t>(f.context), 99999))});
  EXPECT_NE(std::string(api_error_of([&] {
                          f.parser.parse(server::Endpoint::kCompletions, {{"prompt", long_ids}});
                        }).what())
                .find("context"),
            std::string::npos);
}

// A text that cannot fit the context (more bytes than context x the longest
// token) is refused before it is tokenized; one that fits is tokenized and
// its tokens counted.
TEST(RequestLimits, PromptBytesAreCheckedBeforeTokenizing) {
  ParserFixture f;
  const size_t per_token = f.synth.tokenizer->max_text_bytes_per_token();
  const std::string huge(static_cast<size_t>(f.context) * per_token + 1, 'a');
  for (const auto endpoint : {server::Endpoint::kCompletions, server::Endpoint::kChat}) {
    const json body = endpoint == server::Endpoint::kChat
                          ? json{{"messages", {{{"role", "user"}, {"content", huge}}}}}
                          : json{{"prompt", huge}};
    const server::ApiError e = api_error_of([&] { f.parser.parse(endpoint, body); });
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("bytes, more than this model's context"), std::string::npos) << e.what();
  }
}

class RequestLimitsServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { synth_ = new test_util::SynthModel(); }
  static void TearDownTestSuite() { delete synth_; }

  // The status and parsed error of a POST.
  std::pair<int, json> post(const std::string& path, const std::string& body) {
    auto r = server_.client().Post(path.c_str(), body, "application/json");
    if (!r) return {-1, {}};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  static test_util::SynthModel* synth_;
  test_util::TestServer server_{*synth_->model, *synth_->tokenizer};
};
test_util::SynthModel* RequestLimitsServer::synth_ = nullptr;

// Through HTTP: the 16 MiB body of empty arrays is a 400 within seconds.
TEST_F(RequestLimitsServer, NestedArraysBodyGets400) {
  const auto start = std::chrono::steady_clock::now();
  const auto [status, error] = post("/v1/completions", repeated_array("[]"));
  EXPECT_EQ(status, 400);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("request body"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST_F(RequestLimitsServer, ManyPromptsTimesNGet400) {
  const json body = {{"prompt", json::array({"a", "b", "c"})}, {"n", 6}, {"max_tokens", 1}};
  const auto [status, error] = post("/v1/completions", body.dump());
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "n");
}

// /tokenize answers at most the context (256 tokens here), /detokenize takes at most as many.
TEST_F(RequestLimitsServer, TokenizeAndDetokenizeAreCappedAtTheContext) {
  std::string words;
  while (synth_->tokenizer->encode(words, false).size() <= 256) words += "cat ";
  auto [status, error] = post("/tokenize", json{{"content", words}}.dump());
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "content");
  EXPECT_NE(error["error"]["message"].get<std::string>().find("more than the context of 256 tokens"), std::string::npos)
      << error;
  // Certainly too long: refused before tokenizing.
  std::tie(status, error) = post("/tokenize", json{{"content", std::string(8 << 20, 'x')}}.dump());
  EXPECT_EQ(status, 400);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("bytes, more than the context"), std::string::npos) << error;
  std::tie(status, error) = post("/tokenize", json{{"content", "the cat sat"}}.dump());
  EXPECT_EQ(status, 200);

  std::tie(status, error) = post("/detokenize", json{{"tokens", std::vector<int>(257, 5)}}.dump());
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "tokens");
  std::tie(status, error) = post("/detokenize", json{{"tokens", std::vector<int>(256, 5)}}.dump());
  EXPECT_EQ(status, 200);
}

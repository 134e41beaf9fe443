// API keys (issue 31): several of them, from flags, files and KVSERVE_API_KEY,
// sent as "Authorization: Bearer" or "x-api-key", compared in constant time;
// /health needs none.
#include <gtest/gtest.h>

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <string>

#include "core/error.h"
#include "server/api_keys.h"
#include "server_harness.h"

using namespace kvserve;
using json = nlohmann::json;
using server::ApiKeys;
using server::collect_api_keys;
using test_util::TempFile;

namespace {

void write_text(const TempFile& file, const std::string& text) { std::ofstream(file.path(), std::ios::binary) << text; }

// The message of the kvserve::Error f throws ("" for none).
template <typename F>
std::string key_error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ApiKeys, AcceptsExactlyTheKeys) {
  const ApiKeys keys({"first-key", "second", std::string(server::kMaxApiKeyBytes, 'z')});
  EXPECT_TRUE(keys.accepts("first-key"));
  EXPECT_TRUE(keys.accepts("second"));
  EXPECT_TRUE(keys.accepts(std::string(server::kMaxApiKeyBytes, 'z')));
  for (const std::string& wrong : std::vector<std::string>{"", "first", "first-key2", "second ", "Second", "first-keysecond",
                                  std::string(server::kMaxApiKeyBytes + 1, 'z'), std::string("second\0", 7)})
    EXPECT_FALSE(keys.accepts(wrong)) << wrong;
  EXPECT_TRUE(ApiKeys({}).empty());
  EXPECT_FALSE(ApiKeys({}).accepts("anything"));
}

TEST(ApiKeys, ReadsBearerAndXApiKeyHeaders) {
  const ApiKeys keys({"k1", "k2"});
  EXPECT_TRUE(keys.accepts_headers("Bearer k1", ""));
  EXPECT_TRUE(keys.accepts_headers("bearer  k2 ", ""));
  EXPECT_TRUE(keys.accepts_headers("", "k2"));
  EXPECT_TRUE(keys.accepts_headers("Bearer wrong", "k1"));  // either header may carry it
  EXPECT_FALSE(keys.accepts_headers("k1", ""));              // no scheme
  EXPECT_FALSE(keys.accepts_headers("Basic k1", ""));
  EXPECT_FALSE(keys.accepts_headers("Bearerk1", ""));
  EXPECT_FALSE(keys.accepts_headers("Bearer k3", "k4"));
  EXPECT_FALSE(keys.accepts_headers("", ""));
}

TEST(ApiKeys, CollectsFlagsFilesAndTheEnvironment) {
  TempFile file(".keys");
  write_text(file, "# team keys\n\n  file-one  \r\nfile-two\n");
  const std::vector<std::string> keys = collect_api_keys({"flag-key"}, {file.path()}, " env-one, ,env-two ");
  EXPECT_EQ(keys, (std::vector<std::string>{"flag-key", "file-one", "file-two", "env-one", "env-two"}));
  EXPECT_TRUE(collect_api_keys({}, {}, nullptr).empty());
  EXPECT_TRUE(collect_api_keys({}, {}, "").empty());  // set but empty: as unset
}

TEST(ApiKeys, RefusesUnusableKeySourcesNamingThemNotTheKey) {
  EXPECT_NE(key_error_of([] { collect_api_keys({}, {"/nonexistent/keys"}, nullptr); }).find("/nonexistent/keys: cannot open"),
            std::string::npos);
  TempFile empty(".keys");
  write_text(empty, "# nothing yet\n\n");
  EXPECT_NE(key_error_of([&] { collect_api_keys({}, {empty.path()}, nullptr); }).find("holds no key"), std::string::npos);
  EXPECT_NE(key_error_of([] { collect_api_keys({}, {}, " , "); }).find("KVSERVE_API_KEY is set but holds no key"),
            std::string::npos);
  TempFile spaced(".keys");
  write_text(spaced, "good\nsecret with space\n");
  const std::string spaced_error = key_error_of([&] { collect_api_keys({}, {spaced.path()}, nullptr); });
  EXPECT_NE(spaced_error.find("line 2"), std::string::npos) << spaced_error;
  EXPECT_EQ(spaced_error.find("secret"), std::string::npos) << spaced_error;
  EXPECT_NE(key_error_of([] { collect_api_keys({std::string(300, 'k')}, {}, nullptr); }).find("1 to 256"), std::string::npos);
}

class ApiKeysServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { synth_ = new test_util::SynthModel(); }
  static void TearDownTestSuite() { delete synth_; }

  // The status of GET `path` with the headers.
  int status_of(const std::string& path, const httplib::Headers& headers = {}) {
    auto r = server_.client().Get(path.c_str(), headers);
    return r ? r->status : -1;
  }

  static test_util::SynthModel* synth_;
  test_util::TestServer server_{*synth_->model, *synth_->tokenizer, {}, {"alpha-key", "beta-key"}};
};
test_util::SynthModel* ApiKeysServer::synth_ = nullptr;

TEST_F(ApiKeysServer, EachKeyInEitherHeaderIsAccepted) {
  for (const std::string key : {"alpha-key", "beta-key"}) {
    EXPECT_EQ(status_of("/v1/models", {{"Authorization", "Bearer " + key}}), 200) << key;
    EXPECT_EQ(status_of("/v1/models", {{"x-api-key", key}}), 200) << key;
    EXPECT_EQ(status_of("/v1/models", {{"X-Api-Key", key}}), 200) << key;
  }
  EXPECT_EQ(status_of("/health"), 200);
}

TEST_F(ApiKeysServer, WrongOrMissingKeyGets401NamingTheHeaders) {
  EXPECT_EQ(status_of("/v1/models", {{"Authorization", "Bearer gamma-key"}}), 401);
  EXPECT_EQ(status_of("/v1/models", {{"x-api-key", "alpha"}}), 401);
  auto r = server_.client().Post("/v1/completions", R"({"prompt": "a"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
  const json error = json::parse(r->body)["error"];
  EXPECT_EQ(error["type"], "authentication_error");
  const std::string message = error["message"];
  EXPECT_NE(message.find("Authorization: Bearer <key>"), std::string::npos) << message;
  EXPECT_NE(message.find("x-api-key: <key>"), std::string::npos) << message;
}

// `kvserve serve` itself: keys from --api-key (repeated), --api-key-file and
// KVSERVE_API_KEY are all accepted; a missing key file stops it at once.
TEST(ApiKeysCli, ServeTakesKeysFromFlagsFilesAndTheEnvironment) {
  TempFile model(".gguf");
  test_util::write_synth_model(model.path(), "tiny-llama");
  TempFile keys(".keys");
  write_text(keys, "file-key\n");
  // The shell prints its pid, then becomes the server.
  const std::string command = "echo $$; export KVSERVE_API_KEY='env-key-1,env-key-2'; exec " + std::string(KVSERVE_BINARY) +
                              " serve -m " + model.path() + " --port 0 -t 1 --api-key flag-key-1 --api-key flag-key-2" +
                              " --api-key-file " + keys.path() + " 2>&1";
  FILE* out = popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  char line[4096];
  int pid = 0;
  int port = 0;
  std::string log;
  while (port == 0 && std::fgets(line, sizeof line, out)) {
    log += line;
    if (pid == 0) pid = std::atoi(line);
    std::smatch m;
    const std::string text = line;
    if (std::regex_search(text, m, std::regex("on http://127\\.0\\.0\\.1:(\\d+)"))) port = std::stoi(m[1]);
  }
  ASSERT_GT(pid, 0) << log;
  if (port > 0) {
    httplib::Client c("127.0.0.1", port);
    for (const std::string key : {"flag-key-1", "flag-key-2", "file-key", "env-key-1", "env-key-2"}) {
      auto r = c.Get("/v1/models", {{"x-api-key", key}});
      ASSERT_TRUE(r) << key;
      EXPECT_EQ(r->status, 200) << key;
    }
    auto wrong = c.Get("/v1/models", {{"Authorization", "Bearer not-a-key"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401);
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
  }
  kill(pid, SIGTERM);
  pclose(out);
  EXPECT_GT(port, 0) << log;

  const auto missing = test_util::run_kvserve("serve -m " + model.path() + " --port 0 --api-key-file /nonexistent/keys");
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("--api-key-file /nonexistent/keys: cannot open it"), std::string::npos) << missing.output;
}

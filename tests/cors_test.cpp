// CORS (--cors-origins, server/cors.h, issue #33): answers to allowed
// origins carry Access-Control-Allow-Origin (refusals too), a preflight is
// answered before the API key is asked for, other origins get nothing.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/cors.h"
#include "server_harness.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

class CorsServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { synth_ = new test_util::SynthModel("tiny-llama"); }
  static void TearDownTestSuite() { delete synth_; }
  std::unique_ptr<test_util::TestServer> server(std::vector<std::string> origins) const {
    return std::make_unique<test_util::TestServer>(*synth_->model, *synth_->tokenizer, EngineOptions{},
                                                   std::vector<std::string>{"secret"},
                                                   server::ConnectionGateLimits{}, std::move(origins));
  }
  static test_util::SynthModel* synth_;
};
test_util::SynthModel* CorsServer::synth_ = nullptr;

httplib::Headers preflight_from(const std::string& origin) {
  return {{"Origin", origin}, {"Access-Control-Request-Method", "POST"},
          {"Access-Control-Request-Headers", "authorization, content-type"}};
}

}  // namespace

TEST_F(CorsServer, AllowedOriginsGetTheHeadersAndPreflightAnswers) {
  auto s = server({"http://localhost:3000", "https://chat.example"});
  auto c = s->client();
  auto pre = c.Options("/v1/chat/completions", preflight_from("https://chat.example"));
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);  // no key needed: browsers send none with a preflight
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "https://chat.example");
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);

  const json body = {{"prompt", "the cat"}, {"max_tokens", 2}, {"temperature", 0}};
  httplib::Headers from_page = {{"Origin", "http://localhost:3000"}, {"Authorization", "Bearer secret"}};
  auto ok = c.Post("/v1/completions", from_page, body.dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_EQ(ok->get_header_value("Vary"), "Origin");
  // A refusal reaches the page too, so that it can show why.
  auto refused = c.Post("/v1/completions", {{"Origin", "http://localhost:3000"}}, body.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(refused->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");

  auto other = c.Options("/v1/chat/completions", preflight_from("http://evil.example"));
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 403);
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  auto other_post = c.Post("/v1/completions", {{"Origin", "http://evil.example"}, {"Authorization", "Bearer secret"}},
                           body.dump(), "application/json");
  ASSERT_TRUE(other_post);
  EXPECT_FALSE(other_post->has_header("Access-Control-Allow-Origin"));
}

TEST_F(CorsServer, AnyOriginWithStarAndNoneByDefault) {
  auto any = server({"*"});
  auto r = any->client().Get("/health", {{"Origin", "http://anything.example:8081"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://anything.example:8081");
  auto none = server({});
  auto r2 = none->client().Get("/health", {{"Origin", "http://anything.example:8081"}});
  ASSERT_TRUE(r2);
  EXPECT_FALSE(r2->has_header("Access-Control-Allow-Origin"));
}

TEST(CorsPolicy, OriginsThatAreNotOriginsAreRefusedAtStart) {
  for (const char* bad : {"localhost:3000", "http://host/path", "http://", "://x", "http://a b"})
    EXPECT_THROW(server::CorsPolicy({bad}), Error) << bad;
  EXPECT_NO_THROW(server::CorsPolicy({"http://localhost:3000", "*", "https://[::1]:8443"}));
}

// Slow, idle and oversized clients (issue #16 item 5): each is refused or
// timed out with the right status and never holds the workers other clients
// need. The connection gate (server/connection_gate.h) is what makes that so.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/connection_gate.h"
#include "raw_http.h"
#include "server_harness.h"

using namespace kvserve;
using namespace std::chrono_literals;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using server::ConnectionGateLimits;

using namespace kvserve::raw_http;

namespace {

std::string status_line(const std::string& response) { return response.substr(0, response.find("\r\n")); }

ConnectionGateLimits short_limits() {
  ConnectionGateLimits l;
  l.request_deadline = 600ms;
  l.idle_timeout = 400ms;
  return l;
}

struct AbuseTest : ::testing::Test {
  test_util::SynthModel synth;
};

}  // namespace

TEST_F(AbuseTest, SlowHeadersAreTimedOutWith408AndOthersAreServedMeanwhile) {
  test_util::TestServer server(*synth.model, *synth.tokenizer, {}, {}, short_limits());
  std::vector<int> slow;
  for (int i = 0; i < 4; ++i) slow.push_back(connect_to(server.port()));
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  for (size_t i = 0; i < 8; ++i) {  // one byte every 50 ms, on every slow connection
    for (int fd : slow) ASSERT_TRUE(send_all(fd, head.substr(i, 1)));
    auto r = server.client().Get("/health");  // answered while the slow clients dribble
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    std::this_thread::sleep_for(50ms);
  }
  for (int fd : slow) {
    const std::string answer = read_until_closed(fd, 3s);
    EXPECT_EQ(status_line(answer), "HTTP/1.1 408 Request Timeout") << answer;
    EXPECT_NE(answer.find("did not arrive within 600 ms"), std::string::npos) << answer;
    close(fd);
  }
}

TEST_F(AbuseTest, SlowBodyIsTimedOutWith408) {
  test_util::TestServer server(*synth.model, *synth.tokenizer, {}, {}, short_limits());
  const int fd = connect_to(server.port());
  ASSERT_TRUE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Content-Length: 40\r\n\r\n{\"prompt\": \"a"));
  const std::string answer = read_until_closed(fd, 3s);
  EXPECT_EQ(status_line(answer), "HTTP/1.1 408 Request Timeout") << answer;
  close(fd);
}

TEST_F(AbuseTest, ThousandsOfIdleConnectionsDoNotStarveOthersAndAreClosed) {
  ConnectionGateLimits limits;
  limits.idle_timeout = 3s;
  test_util::TestServer server(*synth.model, *synth.tokenizer, {}, {}, limits);
  std::vector<int> idle;
  for (int i = 0; i < 2000; ++i) {
    const int fd = connect_to(server.port());
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  // Without the gate each idle connection would hold one of the server's
  // workers until it timed out, and these would wait behind them all.
  const auto start = Clock::now();
  for (int i = 0; i < 5; ++i) {
    auto r = server.client().Post("/v1/completions", R"({"prompt": "hello", "max_tokens": 2})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  EXPECT_LT(Clock::now() - start, limits.idle_timeout);
  // Then the idle ones are closed, quietly (no request, no answer).
  for (int fd : idle) {
    EXPECT_EQ(read_until_closed(fd, 6s), "");
    close(fd);
  }
}

TEST_F(AbuseTest, OverlongHeadIs431AndOverlongBodyIs413) {
  test_util::TestServer server(*synth.model, *synth.tokenizer);
  int fd = connect_to(server.port());
  ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nX-Filler: " + std::string(20000, 'a')));
  std::string answer = read_until_closed(fd, 3s);
  EXPECT_EQ(status_line(answer), "HTTP/1.1 431 Request Header Fields Too Large") << answer.substr(0, 200);
  close(fd);

  fd = connect_to(server.port());
  ASSERT_TRUE(send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           "Content-Length: 100000000\r\n\r\n" + std::string(40000, ' ')));
  answer = read_until_closed(fd, 3s);
  EXPECT_EQ(status_line(answer), "HTTP/1.1 413 Payload Too Large") << answer.substr(0, 200);
  EXPECT_NE(answer.find("larger than 16777216 bytes"), std::string::npos) << answer;
  close(fd);
}

TEST_F(AbuseTest, PromptPastTheContextIs400NamingIt) {
  test_util::TestServer server(*synth.model, *synth.tokenizer);
  std::string prompt;
  for (int i = 0; i < 400; ++i) prompt += "word ";
  auto r = server.client().Post("/v1/completions", json{{"prompt", prompt}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  const json body = json::parse(r->body);
  EXPECT_EQ(body["error"]["param"], "prompt") << r->body;
  EXPECT_NE(body["error"]["message"].get<std::string>().find("context"), std::string::npos) << r->body;
  auto health = server.client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(AbuseTest, KeptAliveConnectionServesSeveralRequests) {
  test_util::TestServer server(*synth.model, *synth.tokenizer);
  httplib::Client c = server.client();
  c.set_keep_alive(true);
  for (int i = 0; i < 4; ++i) {
    auto r = c.Post("/v1/completions", R"({"prompt": "hello", "max_tokens": 2})", "application/json");
    ASSERT_TRUE(r) << "request " << i;
    EXPECT_EQ(r->status, 200);
  }
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

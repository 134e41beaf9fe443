// A non-streaming request whose client hangs up is cancelled at once: its KV
// blocks go back to the pool, and the server still answers. The model is the
// tiny synthesized one with 48 layers, so that the request (8 choices of 240
// tokens) runs for seconds: long enough that cancelling shows.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "model/model.h"
#include "server_harness.h"
#include "test_util.h"

using namespace kvserve;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Sends one HTTP POST on a new connection and returns the socket without reading the answer.
int post_and_leave_open(int port, const std::string& path, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  const std::string request = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// Polls /metrics until `done` holds or `timeout` passes; returns the last metrics.
template <class Done>
std::map<std::string, double> wait_for(const test_util::TestServer& server, std::chrono::milliseconds timeout, Done done) {
  const auto end = Clock::now() + timeout;
  std::map<std::string, double> m = server.metrics();
  while (!done(m) && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    m = server.metrics();
  }
  return m;
}

bool idle(std::map<std::string, double>& m) {
  return m["kvserve_requests_running"] == 0 && m["kvserve_requests_waiting"] == 0 && m["kvserve_kv_blocks_used"] == 0;
}

}  // namespace

// The tiny synthesized model with 48 layers, made once for the suite.
class ServerDisconnectTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);
    synth_ = new test_util::SynthModel("tiny-llama", 48);
  }
  static void TearDownTestSuite() { delete synth_; }
  static test_util::SynthModel* synth_;
};

test_util::SynthModel* ServerDisconnectTest::synth_ = nullptr;

TEST_F(ServerDisconnectTest, NonStreamingRequestIsCancelledWhenTheClientLeaves) {
  test_util::TestServer server(*synth_->model, *synth_->tokenizer);
  constexpr int kChoices = 8, kMaxTokens = 240;
  const json body = {{"prompt", "the cat sat"}, {"max_tokens", kMaxTokens}, {"n", kChoices}, {"ignore_eos", true}};

  const int fd = post_and_leave_open(server.port(), "/v1/completions", body.dump());
  ASSERT_GE(fd, 0);
  auto m = wait_for(server, std::chrono::seconds(30), [](auto& m) {
    return m["kvserve_requests_running"] > 0 && m["kvserve_generation_tokens_total"] > 0;  // both: published apart
  });
  ASSERT_GT(m["kvserve_requests_running"], 0) << "the request finished or never started";
  close(fd);
  const auto closed_at = Clock::now();
  m = wait_for(server, std::chrono::seconds(10), idle);
  const double seconds = std::chrono::duration<double>(Clock::now() - closed_at).count();

  EXPECT_TRUE(idle(m)) << "still running " << m["kvserve_requests_running"] << ", blocks used " << m["kvserve_kv_blocks_used"];
  // The handler checks its client every 100 ms, then the engine ends the request after its current step
  // (slow on a loaded 2-core host); the request itself had seconds of work left.
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(m["kvserve_client_disconnects_total"], 1);
  EXPECT_LT(m["kvserve_generation_tokens_total"], kChoices * kMaxTokens);  // cut short, not run to the end
  EXPECT_EQ(m["kvserve_kv_blocks_free"] + m["kvserve_kv_blocks_cached"], m["kvserve_kv_blocks_total"]);

  auto r = server.client().Post("/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST_F(ServerDisconnectTest, NonStreamingClientThatStaysGetsItsAnswer) {
  // The check must not mistake a client that waits quietly for one that left.
  test_util::TestServer server(*synth_->model, *synth_->tokenizer);
  auto client = server.client();
  client.set_keep_alive(true);
  for (int i = 0; i < 2; ++i) {  // keep-alive: the same connection answers several requests
    auto r = client.Post("/v1/completions", json{{"prompt", "the cat"}, {"max_tokens", 16}, {"ignore_eos", true}}.dump(),
                         "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 16);
  }
  EXPECT_EQ(server.metrics()["kvserve_client_disconnects_total"], 0);
}

// The HTTP front end (issue #31 section 2): the gate reads every request whole
// under fixed limits before a worker sees it. Unit tests of the request
// reader on awkward bytes, then each measured attack on raw sockets: the
// attacker gets the right status (or a closed connection) within the
// deadline, the server's memory stays flat, and a concurrent greedy stream
// gets the same tokens as in a quiet run.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "server/http_request_reader.h"
#include "raw_http.h"
#include "server_harness.h"

using namespace kvserve;
using namespace std::chrono_literals;
using namespace std::string_literals;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using server::ConnectionGateLimits;
using server::HttpRequestLimits;
using server::HttpRequestReader;
using State = HttpRequestReader::State;

using namespace kvserve::raw_http;

namespace {

// ---- the request reader ----

HttpRequestReader read_all(const std::string& bytes, HttpRequestLimits limits = {}, bool byte_by_byte = false) {
  HttpRequestReader r(limits);
  if (!byte_by_byte) r.feed(bytes);
  else
    for (char c : bytes) r.feed(std::string_view(&c, 1));
  return r;
}

int refusal(const std::string& bytes, HttpRequestLimits limits = {}) {
  HttpRequestReader r = read_all(bytes, limits);
  return r.state() == State::kRefused ? r.refusal_status() : 0;
}

// Sends next() over and over as fast as the server reads, until it answers
// (or closes), `max_bytes` went out or `limit` passed; then what it answered.
std::string flood(int fd, const std::function<std::string()>& next, size_t max_bytes, std::chrono::milliseconds limit) {
  size_t sent = 0;
  const auto end = Clock::now() + limit;
  std::string pending;
  while (sent < max_bytes && Clock::now() < end) {
    pollfd p{fd, POLLIN | POLLOUT, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) break;
    if (pending.empty()) pending = next();
    const ssize_t n = send(fd, pending.data(), pending.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) break;
    pending.erase(0, static_cast<size_t>(n));
    sent += static_cast<size_t>(n);
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
  return read_until_closed(fd, std::max(left, 0ms) + 1000ms);
}

std::string status_line(const std::string& response) { return response.substr(0, response.find("\r\n")); }

ConnectionGateLimits test_limits() {
  ConnectionGateLimits l;
  l.request_deadline = 2s;
  l.idle_timeout = 1s;
  l.max_body_bytes = 1 << 20;
  return l;
}

struct FrontTest : ::testing::Test {
  test_util::SynthModel synth;
  test_util::TestServer server{*synth.model, *synth.tokenizer, {}, {}, test_limits()};
  std::string quiet = greedy_stream(server, "Once upon a time", 24);

  // Runs `attack` (which returns what the server answered it) while a greedy
  // stream runs; checks the answer's status line, the time it took, memory,
  // and that the stream's text is the quiet run's.
  void expect_answer_while_streaming(const std::function<std::string()>& attack, const std::string& expected_status,
                                     std::chrono::milliseconds within = 4s) {
    ASSERT_FALSE(quiet.empty());
    const int64_t rss_before = resident_kib();
    std::string streamed;
    std::thread stream([&] { streamed = greedy_stream(server, "Once upon a time", 24); });
    const auto start = Clock::now();
    const std::string answer = attack();
    const auto took = Clock::now() - start;
    stream.join();
    if (expected_status.empty()) EXPECT_EQ(answer, "");
    else EXPECT_EQ(status_line(answer), expected_status) << answer.substr(0, 300);
    EXPECT_LT(took, within);
    EXPECT_LT(resident_kib() - rss_before, 64 << 10) << "KiB of growth";
    EXPECT_EQ(streamed, quiet);
    auto health = server.client().Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
  }
};

const std::string kPostHead = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";

}  // namespace

TEST(HttpRequestReader, ReadsACanonicalRequest) {
  const std::string body = R"({"prompt": "hi"})";
  const std::string bytes = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: x\r\ncontent-LENGTH: " +
                            std::to_string(body.size()) + "\r\nExpect: 100-continue\r\n\r\n" + body;
  for (bool byte_by_byte : {false, true}) {
    HttpRequestReader r = read_all(bytes, {}, byte_by_byte);
    ASSERT_EQ(r.state(), State::kComplete);
    EXPECT_EQ(r.method(), "POST");
    EXPECT_EQ(r.target(), "/v1/completions?x=1");
    const HttpRequestReader::Request request = r.take_request();
    EXPECT_EQ(request.head, "POST /v1/completions?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n");
    EXPECT_EQ(request.body, body);
    EXPECT_EQ(r.take_leftover(), "");
  }
  // Empty lines before the request line are skipped (RFC 9112 2.2); a GET gets Content-Length: 0.
  HttpRequestReader get = read_all("\r\n\r\nGET /health HTTP/1.0\r\n\r\n");
  ASSERT_EQ(get.state(), State::kComplete);
  EXPECT_EQ(get.take_request().head, "GET /health HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
}

TEST(HttpRequestReader, KeepsPipelinedBytesForTheNextRequest) {
  HttpRequestReader r = read_all("GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\nGET /c");
  ASSERT_EQ(r.state(), State::kComplete);
  EXPECT_EQ(r.target(), "/a");
  EXPECT_EQ(r.take_leftover(), "GET /b HTTP/1.1\r\n\r\nGET /c");
  HttpRequestReader with_body = read_all("POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\n");
  ASSERT_EQ(with_body.state(), State::kComplete);
  EXPECT_EQ(with_body.take_request().body, "abc");
  EXPECT_EQ(with_body.take_leftover(), "GET / HTTP/1.1\r\n");
}

TEST(HttpRequestReader, HeadEndsOnlyAtCrlfCrlf) {
  EXPECT_EQ(read_all("GET / HTTP/1.1\r\nHost: x\r\n").state(), State::kHead);
  EXPECT_EQ(refusal("GET / HTTP/1.1\n\n"), 400);
  EXPECT_EQ(refusal("GET / HTTP/1.1\r\nHost: x\n\r\n"), 400);
  EXPECT_EQ(refusal("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n"), 400);  // a bare CR inside a value
  EXPECT_EQ(refusal("GET / HTTP/1.1\r\nX: a\0b\r\n\r\n"s), 400);
  EXPECT_EQ(refusal("GET / HTTP/1.1\r\n folded\r\n\r\n"), 400);
  EXPECT_EQ(refusal("GET / HTTP/1.1\r\nX : v\r\n\r\n"), 400);
  EXPECT_EQ(refusal("GET / HTTP/1.1\r\nno colon\r\n\r\n"), 400);
  EXPECT_EQ(refusal("GET /\r\n\r\n"), 400);
  EXPECT_EQ(refusal("GET  / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(refusal("G(T / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(refusal("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(refusal("GET / FTP/1.1\r\n\r\n"), 400);
}

TEST(HttpRequestReader, BoundsLinesHeadersAndHeadSize) {
  HttpRequestLimits l;
  l.max_head_bytes = 1000;
  l.max_header_line_bytes = 100;
  l.max_headers = 5;
  // An endless line is refused once it passes the line limit, ended or not.
  EXPECT_EQ(refusal("GET / HTTP/1.1\r\nX: " + std::string(200, 'a'), l), 431);
  EXPECT_EQ(refusal("GET / HTTP/1.1\r\nX: " + std::string(200, 'a') + "\r\n\r\n", l), 431);
  EXPECT_EQ(refusal("GET /" + std::string(200, 'a') + " HTTP/1.1\r\n\r\n", l), 431);
  EXPECT_EQ(read_all("GET / HTTP/1.1\r\nX: " + std::string(90, 'a') + "\r\n\r\n", l).state(), State::kComplete);
  std::string head = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 5; ++i) head += "X-" + std::to_string(i) + ": v\r\n";
  EXPECT_EQ(read_all(head + "\r\n", l).state(), State::kComplete);
  EXPECT_EQ(refusal(head + "X-5: v\r\n\r\n", l), 431);
  l.max_headers = 100;
  std::string big = "GET / HTTP/1.1\r\n";
  while (big.size() < 1100) big += "X: " + std::string(90, 'b') + "\r\n";
  EXPECT_EQ(refusal(big, l), 431);
  // Empty lines before the request line still count against the head's size.
  std::string empty_lines;
  for (int i = 0; i < 600; ++i) empty_lines += "\r\n";
  EXPECT_EQ(refusal(empty_lines, l), 431);
}

TEST(HttpRequestReader, AcceptsOnlyOneValidContentLength) {
  HttpRequestLimits l;
  l.max_body_bytes = 1000;
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", l), 400);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", l), 400);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", l), 400);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nContent-Length: 1 0\r\n\r\n", l), 400);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", l), 400);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", l), 400);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", l), 400);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", l), 400);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", l), 413);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999999999\r\n\r\n", l), 413);
  HttpRequestReader r = read_all("POST / HTTP/1.1\r\nContent-Length:  1000 \r\n\r\n" + std::string(999, 'x'), l);
  EXPECT_EQ(r.state(), State::kBody);
  EXPECT_EQ(r.announced_body_bytes(), 1000u);
  EXPECT_GE(r.buffered_bytes(), 1000u);  // the announced body counts from the head on
  r.feed("x");
  EXPECT_EQ(r.state(), State::kComplete);
}

TEST(HttpRequestReader, DecodesChunkedBodiesUnderTheSameBudget) {
  HttpRequestLimits l;
  l.max_body_bytes = 100;
  const std::string head = "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n";
  const std::string chunked = head + "5;ext=1\r\nhello\r\n1 \r\n \r\n6\r\nworld!\r\n0\r\nTrailer: x\r\n\r\nNEXT";
  for (bool byte_by_byte : {false, true}) {
    HttpRequestReader r = read_all(chunked, l, byte_by_byte);
    ASSERT_EQ(r.state(), State::kComplete) << r.refusal_message();
    const HttpRequestReader::Request request = r.take_request();
    EXPECT_EQ(request.head, "POST /v1/completions HTTP/1.1\r\nContent-Length: 12\r\n\r\n");
    EXPECT_EQ(request.body, "hello world!");
    EXPECT_EQ(r.take_leftover(), "NEXT");
  }
  EXPECT_EQ(refusal(head + "65\r\n", l), 413);                 // one chunk past the limit
  EXPECT_EQ(refusal(head + "32\r\n" + std::string(50, 'a') + "\r\n33\r\n", l), 413);  // the sum past it
  EXPECT_EQ(refusal(head + "ffffffffffffffffffffffff\r\n", l), 413);  // no overflow
  EXPECT_EQ(refusal(head + "zz\r\n", l), 400);
  EXPECT_EQ(refusal(head + "\r\n", l), 400);
  EXPECT_EQ(refusal(head + "5\nhello", l), 400);
  EXPECT_EQ(refusal(head + "5\r\nhelloXX", l), 400);
  EXPECT_EQ(refusal(head + "1;" + std::string(2000, 'e'), l), 400);
  EXPECT_EQ(refusal(head + "0\r\nT: " + std::string(20000, 't'), l), 431);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", l), 501);
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", l), 400);
}

TEST(HttpRequestReader, AnswersExpectContinueOnlyWhenTheBodyIsAwaited) {
  HttpRequestReader r = read_all("POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_EQ(r.state(), State::kBody);
  EXPECT_TRUE(r.wants_continue());
  r.continue_sent();
  EXPECT_FALSE(r.wants_continue());
  r.feed("ok");
  ASSERT_EQ(r.state(), State::kComplete);
  EXPECT_EQ(r.take_request().head.find("Expect"), std::string::npos);
  EXPECT_FALSE(read_all("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok").wants_continue());
  EXPECT_EQ(refusal("POST / HTTP/1.1\r\nExpect: something-else\r\n\r\n"), 417);
}

TEST_F(FrontTest, BareLfHeadWithAnEndlessLineIs400) {
  expect_answer_while_streaming(
      [&] {
        const int fd = connect_to(server.port());
        send_all(fd, "GET /health HTTP/1.1\nX-Filler: ");
        const std::string answer = flood(fd, [] { return std::string(64 << 10, 'a'); }, 256 << 20, 3s);
        close(fd);
        return answer;
      },
      "HTTP/1.1 400 Bad Request");
}

TEST_F(FrontTest, EndlessHeaderLineIs431) {
  expect_answer_while_streaming(
      [&] {
        const int fd = connect_to(server.port());
        send_all(fd, "GET /health HTTP/1.1\r\nX-Filler: ");
        const std::string answer = flood(fd, [] { return std::string(64 << 10, 'a'); }, 256 << 20, 3s);
        close(fd);
        return answer;
      },
      "HTTP/1.1 431 Request Header Fields Too Large");
}

TEST_F(FrontTest, TooManyHeadersIs431) {
  expect_answer_while_streaming(
      [&] {
        const int fd = connect_to(server.port());
        send_all(fd, "GET /health HTTP/1.1\r\n");
        const std::string answer = flood(fd, [] { return std::string("X-A: b\r\n"); }, 1 << 20, 3s);
        close(fd);
        return answer;
      },
      "HTTP/1.1 431 Request Header Fields Too Large");
}

TEST_F(FrontTest, EndlessChunkedBodyIs413AtTheBodyLimit) {
  expect_answer_while_streaming(
      [&] {
        const int fd = connect_to(server.port());
        send_all(fd, kPostHead + "Transfer-Encoding: chunked\r\n\r\n");
        const std::string answer = flood(fd, [] { return "1000\r\n" + std::string(4096, 'a') + "\r\n"; }, 256 << 20, 3s);
        close(fd);
        return answer;
      },
      "HTTP/1.1 413 Payload Too Large");
}

TEST_F(FrontTest, NegativeContentLengthIs400) {
  expect_answer_while_streaming(
      [&] {
        const int fd = connect_to(server.port());
        send_all(fd, kPostHead + "Content-Length: -1\r\n\r\n");
        const std::string answer = flood(fd, [] { return std::string(64 << 10, '['); }, 256 << 20, 3s);
        close(fd);
        return answer;
      },
      "HTTP/1.1 400 Bad Request");
}

TEST_F(FrontTest, DuplicateContentLengthIs400) {
  expect_answer_while_streaming(
      [&] {
        const int fd = connect_to(server.port());
        send_all(fd, kPostHead + "Content-Length: 2\r\nContent-Length: 20\r\n\r\n{}");
        const std::string answer = read_until_closed(fd, 3s);
        close(fd);
        return answer;
      },
      "HTTP/1.1 400 Bad Request");
}

TEST_F(FrontTest, ContentLengthPastTheLimitIs413BeforeTheBody) {
  expect_answer_while_streaming(
      [&] {
        const int fd = connect_to(server.port());
        send_all(fd, kPostHead + "Content-Length: " + std::to_string((1 << 20) + 1) + "\r\n\r\n");
        const std::string answer = read_until_closed(fd, 3s);
        EXPECT_NE(answer.find("larger than 1048576 bytes"), std::string::npos) << answer;
        close(fd);
        return answer;
      },
      "HTTP/1.1 413 Payload Too Large");
}

TEST_F(FrontTest, TrickledHeadIs408AtTheDeadline) {
  expect_answer_while_streaming(
      [&] {
        const int fd = connect_to(server.port());
        const std::string head = kPostHead + "X-Slow: " + std::string(100, 's');
        std::string answer;
        for (size_t i = 0; i < head.size() && answer.empty(); ++i) {  // a byte every 100 ms
          if (!send_all(fd, head.substr(i, 1))) break;
          answer = read_until_closed(fd, 100ms);
        }
        close(fd);
        return answer;
      },
      "HTTP/1.1 408 Request Timeout", 3s);
}

TEST_F(FrontTest, ThousandIdleConnectionsAreHeldAndClosedQuietly) {
  const int64_t rss_before = resident_kib();
  std::vector<int> idle;
  for (int i = 0; i < 1000; ++i) {
    const int fd = connect_to(server.port());
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  // Served while the idle ones are held (each would have held a worker before the gate).
  EXPECT_EQ(greedy_stream(server, "Once upon a time", 24), quiet);
  for (int i = 0; i < 5; ++i) {
    auto r = server.client().Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
  for (int fd : idle) {
    EXPECT_EQ(read_until_closed(fd, 3s), "");
    close(fd);
  }
  EXPECT_LT(resident_kib() - rss_before, 64 << 10) << "KiB of growth";
}

TEST_F(FrontTest, PipelinedRequestsAreAnsweredInOrder) {
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})";
  const int fd = connect_to(server.port());
  ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + kPostHead + "Content-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body +
                               "GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string answer = read_until_closed(fd, 10s);
  close(fd);
  const size_t health = answer.find("{\"status\":\"ok\"}"), completion = answer.find("\"text_completion\""),
               version = answer.find("\"kvserve\"");
  ASSERT_NE(health, std::string::npos) << answer;
  ASSERT_NE(completion, std::string::npos) << answer;
  ASSERT_NE(version, std::string::npos) << answer;
  EXPECT_LT(health, completion);
  EXPECT_LT(completion, version);
}

TEST_F(FrontTest, ChunkedRequestIsDecodedAndServed) {
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0})";
  const int fd = connect_to(server.port());
  std::string chunked = kPostHead + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
  for (size_t at = 0; at < body.size(); at += 10) {
    const std::string piece = body.substr(at, 10);
    char size[16];
    std::snprintf(size, sizeof size, "%zx", piece.size());
    chunked += std::string(size) + "\r\n" + piece + "\r\n";
  }
  ASSERT_TRUE(send_all(fd, chunked + "0\r\n\r\n"));
  const std::string answer = read_until_closed(fd, 10s);
  close(fd);
  ASSERT_EQ(status_line(answer), "HTTP/1.1 200 OK") << answer;
  const json reply = json::parse(answer.substr(answer.find("\r\n\r\n") + 4));
  EXPECT_EQ(reply["choices"][0]["text"], quiet);
}

TEST_F(FrontTest, ExpectContinueIsAnsweredOnceByTheGate) {
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0})";
  const int fd = connect_to(server.port());
  ASSERT_TRUE(send_all(fd, kPostHead + "Expect: 100-continue\r\nConnection: close\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n"));
  std::string interim;
  char c;
  while (interim.size() < 25 && recv(fd, &c, 1, 0) == 1) interim += c;
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(send_all(fd, body));
  const std::string answer = read_until_closed(fd, 10s);
  close(fd);
  ASSERT_EQ(status_line(answer), "HTTP/1.1 200 OK") << answer;
  EXPECT_EQ(json::parse(answer.substr(answer.find("\r\n\r\n") + 4))["choices"][0]["text"], quiet);
}

TEST(HttpFront, BufferedBytesPastTheBudgetAre503WithRetryAfter) {
  test_util::SynthModel synth;
  ConnectionGateLimits limits = test_limits();
  limits.max_buffered_bytes = (3 << 20) + (64 << 10);  // three announced 1 MiB bodies (and their heads) at most
  test_util::TestServer server(*synth.model, *synth.tokenizer, {}, {}, limits);
  std::vector<int> fds;
  std::string refused;
  for (int i = 0; i < 4 && refused.empty(); ++i) {
    fds.push_back(connect_to(server.port()));
    ASSERT_TRUE(send_all(fds.back(), kPostHead + "Content-Length: " + std::to_string(1 << 20) + "\r\n\r\n{"));
    refused = read_until_closed(fds.back(), 300ms);
  }
  EXPECT_EQ(fds.size(), 4u);
  EXPECT_EQ(status_line(refused), "HTTP/1.1 503 Service Unavailable") << refused;
  EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
  for (int fd : fds) close(fd);
  // Closed connections give their bytes back: a new body fits again.
  std::this_thread::sleep_for(300ms);
  auto r = server.client().Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(HttpFront, HealthAnswersBesideHundredsOfOpenStreams) {
  test_util::SynthModel synth;
  EngineOptions eo;
  eo.max_queue = 300;  // every stream is accepted: each holds a worker while it waits or streams
  eo.max_running = 16;
  test_util::TestServer server(*synth.model, *synth.tokenizer, eo, {}, test_limits());
  const std::string quiet = greedy_stream(server, "Once upon a time", 24);
  ASSERT_FALSE(quiet.empty());
  std::vector<std::string> streamed(256);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < streamed.size(); ++i) clients.emplace_back([&, i] { streamed[i] = greedy_stream(server, "Once upon a time", 24); });
  std::vector<double> health_ms;
  for (int i = 0; i < 20; ++i) {
    const auto t0 = Clock::now();
    auto r = server.client().Get("/health");
    health_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    std::this_thread::sleep_for(20ms);
  }
  for (std::thread& t : clients) t.join();
  for (const std::string& text : streamed) EXPECT_EQ(text, quiet);
  // Quick requests have workers of their own: only a starved machine comes near this.
  EXPECT_LT(*std::max_element(health_ms.begin(), health_ms.end()), 1000.0);
}

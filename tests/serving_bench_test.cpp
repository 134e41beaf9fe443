// The serving benchmark's parts (workload, SSE parser, URL, statistics) and
// the remote benchmark end to end against an in-process server on a free
// loopback port: counts, the CLI, and clear failures (unreachable server,
// HTTP error, malformed or cut stream, a server that never answers).
#include <gtest/gtest.h>

#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "loadgen/engine_load_driver.h"
#include "loadgen/http_url.h"
#include "loadgen/http_load_driver.h"
#include "loadgen/serving_stats.h"
#include "loadgen/sse_parser.h"
#include "loadgen/workload.h"
#include "core/error.h"
#include "model/model.h"
#include "server_harness.h"
#include "test_util.h"

using namespace kvserve;
using namespace kvserve::loadgen;

namespace {

WorkloadOptions small_workload(int requests) {
  WorkloadOptions w;
  w.requests = requests;
  w.max_prompt = 24;
  w.max_output = 10;
  w.shared_prefix = 20;
  w.seed = 5;
  return w;
}

std::vector<std::string> parse_all(const std::vector<std::string>& pieces) {
  SseParser p;
  std::vector<std::string> out;
  for (const std::string& piece : pieces) p.feed(piece, [&](const std::string& d) { out.push_back(d); });
  return out;
}

// The tiny synthesized model, loaded once for the suite.
class RemoteBenchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    signal(SIGPIPE, SIG_IGN);
    synth_ = new test_util::SynthModel();
  }
  static void TearDownTestSuite() { delete synth_; }
  static HttpLoadOptions remote(const std::string& url, int concurrency = 3) {
    HttpLoadOptions o;
    o.url = url;
    o.concurrency = concurrency;
    o.client.timeout_s = 20;
    return o;
  }
  // The message run_http_load throws, or "" when it succeeds.
  static std::string remote_error(const HttpLoadOptions& o, const std::vector<WorkItem>& items) {
    try {
      run_http_load(o, items);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  static test_util::SynthModel* synth_;
};

test_util::SynthModel* RemoteBenchTest::synth_ = nullptr;

// A stand-in server: /v1/models lists "fake", /v1/completions runs `answer`.
class FakeServer {
 public:
  explicit FakeServer(httplib::Server::Handler answer) {
    http_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object": "list", "data": [{"id": "fake"}]})", "application/json");
    });
    http_.Post("/v1/completions", std::move(answer));
    port_ = http_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { http_.listen_after_bind(); });
  }
  ~FakeServer() {
    http_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  httplib::Server http_;
  std::thread thread_;
  int port_ = 0;
};

void answer_sse(httplib::Response& res, const std::string& body) { res.set_content(body, "text/event-stream"); }

}  // namespace

TEST(Workload, SameArrivalsAndLengthsWithOrWithoutATokenizer) {
  const test_util::SynthModel synth;
  const Tokenizer& tok = *synth.tokenizer;
  WorkloadOptions w = small_workload(20);
  w.request_rate = 4;
  const std::vector<WorkItem> exact = make_workload(w, &tok), approx = make_workload(w, nullptr);
  ASSERT_EQ(exact.size(), 20u);
  ASSERT_EQ(approx.size(), 20u);
  double last = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    EXPECT_EQ(exact[i].arrival_s, approx[i].arrival_s);
    EXPECT_GE(exact[i].arrival_s, last);
    last = exact[i].arrival_s;
    EXPECT_EQ(exact[i].output_tokens, approx[i].output_tokens);
    EXPECT_GE(exact[i].output_tokens, 1);
    EXPECT_LE(exact[i].output_tokens, 10);
    EXPECT_EQ(exact[i].prompt_ids, tok.encode(exact[i].prompt, tok.add_bos()));
    EXPECT_EQ(exact[i].prompt_tokens, static_cast<int64_t>(exact[i].prompt_ids.size()));
    EXPECT_TRUE(approx[i].prompt_ids.empty());
    EXPECT_GE(approx[i].prompt_tokens, 20 + 1);  // shared prefix + at least one word, one token per word
  }
  EXPECT_GT(last, 0);
}

TEST(Workload, SharedSystemPromptStartsEveryPrompt) {
  const std::vector<WorkItem> items = make_workload(small_workload(6), nullptr);
  const std::string first = items[0].prompt;
  size_t common = first.size();
  for (const WorkItem& w : items) common = std::min(common, static_cast<size_t>(std::mismatch(first.begin(), first.end(), w.prompt.begin(), w.prompt.end()).first - first.begin()));
  // Twenty words of one token each (approximate count): at least 20 words in common.
  const std::string shared = first.substr(0, common);
  EXPECT_GE(std::count(shared.begin(), shared.end(), ' '), 20) << shared;
  WorkloadOptions bad = small_workload(0);
  EXPECT_THROW(make_workload(bad, nullptr), Error);
}

// --prefix-groups: each prompt starts with one of G system prompts, drawn at
// random (not in turn, which a round-robin router would follow by chance);
// one group leaves the workload as it was.
TEST(Workload, PrefixGroupsDrawOneOfSeveralSystemPrompts) {
  WorkloadOptions w = small_workload(40);
  const std::vector<WorkItem> one = make_workload(w, nullptr);
  w.prefix_groups = 1;
  EXPECT_EQ(make_workload(w, nullptr)[7].prompt, one[7].prompt);
  w.prefix_groups = 3;
  const std::vector<WorkItem> items = make_workload(w, nullptr);
  std::map<std::string, std::vector<size_t>> by_group;  // the first 20 words -> requests
  for (size_t i = 0; i < items.size(); ++i) {
    size_t end = 0;
    for (int k = 0; k < 20; ++k) end = items[i].prompt.find(' ', end) + 1;
    by_group[items[i].prompt.substr(0, end)].push_back(i);
    EXPECT_EQ(items[i].output_tokens, one[i].output_tokens);
  }
  ASSERT_EQ(by_group.size(), 3u);
  bool in_turn = true;
  for (const auto& [prefix, members] : by_group)
    for (size_t k = 1; k < members.size(); ++k) in_turn = in_turn && members[k] - members[k - 1] == 3;
  EXPECT_FALSE(in_turn);
  w.prefix_groups = 0;
  EXPECT_THROW(make_workload(w, nullptr), Error);
}

TEST(SseParser, SplitsEventsAcrossPiecesLineEndingsAndComments) {
  EXPECT_EQ(parse_all({"data: {\"a\"", ": 1}\n\n", ": keep-alive\n\n", "data: [DONE]\r\n\r\n"}),
            (std::vector<std::string>{"{\"a\": 1}", "[DONE]"}));
  EXPECT_EQ(parse_all({"event: x\nid: 3\ndata:one\ndata: two\n", "\n"}), (std::vector<std::string>{"one\ntwo"}));
  SseParser p;
  p.feed("data: cut", [](const std::string&) { FAIL(); });
  EXPECT_TRUE(p.has_partial_event());
}

TEST(HttpUrl, ParsesHostPortAndApiBase) {
  const HttpUrl a = parse_http_url("http://127.0.0.1:8080");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 8080);
  EXPECT_EQ(a.api_base, "/v1");
  EXPECT_EQ(a.endpoint("/completions"), "http://127.0.0.1:8080/v1/completions");
  EXPECT_EQ(parse_http_url("http://localhost:8000/v1/").api_base, "/v1");
  EXPECT_EQ(parse_http_url("http://example.org/openai").api_base, "/openai/v1");
  EXPECT_EQ(parse_http_url("http://example.org").port, 80);
  for (const char* bad : {"127.0.0.1:8080", "https://x.org", "http://:80", "http://h:0", "http://h:99999", "http://h:8x"})
    EXPECT_THROW(parse_http_url(bad), Error) << bad;
}

TEST(ServingStats, PercentilesAndSummary) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  const Stats s = stats_of(v);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_EQ(s.p50, 51);
  EXPECT_EQ(s.p99, 100);
  RequestTiming t;
  t.arrival_s = 1;
  t.add_delivery(1.5, 1);
  t.add_delivery(1.7, 2);
  t.add_delivery(2.1, 1);
  t.finish_s = 2.1;
  const ServingSummary sum = summarize({t});
  EXPECT_EQ(sum.requests, 1);
  EXPECT_EQ(sum.output_tokens, 4);
  EXPECT_NEAR(sum.ttft_ms.mean, 500, 1e-9);
  EXPECT_NEAR(sum.tpot_ms.mean, 200, 1e-9);  // (2.1 - 1.5) / 3 tokens after the first
  EXPECT_NEAR(sum.itl_ms.mean, 300, 1e-9);   // gaps of 200 and 400 ms
  EXPECT_NEAR(sum.output_tokens_per_s, 4 / 2.1, 1e-9);
}

TEST_F(RemoteBenchTest, InProcessSchedulesGenerateTheRequestedTokens) {
  const std::vector<WorkItem> items = make_workload(small_workload(6), synth_->tokenizer.get());
  for (Schedule schedule : {Schedule::kStatic, Schedule::kStaticEarlyExit, Schedule::kContinuous, Schedule::kContinuousPrefix}) {
    const EngineLoadRun run = run_engine_load(*synth_->model, *synth_->tokenizer, items, 4, schedule);
    const ServingSummary s = summarize(run.timings);
    EXPECT_EQ(s.requests, 6) << schedule_name(schedule);
    EXPECT_EQ(s.output_tokens, totals_of(items).output_tokens) << schedule_name(schedule);
    EXPECT_GT(s.ttft_ms.mean, 0);
    EXPECT_EQ(run.metrics.requests_finished, 6);
    if (schedule == Schedule::kContinuousPrefix) {
      EXPECT_GT(run.metrics.prefix_hit_tokens, 0);  // the shared prefix
    }
    // Padded static batches compute every sequence to its batch's longest
    // output (batches of 4 in order: items 0-3, then 4-5); the others compute
    // exactly the outputs.
    int64_t padded = 0;
    for (size_t b = 0; b < items.size(); b += 4) {
      int64_t longest = 0;
      const size_t end = std::min(items.size(), b + 4);
      for (size_t i = b; i < end; ++i) longest = std::max(longest, items[i].output_tokens);
      padded += longest * static_cast<int64_t>(end - b);
    }
    EXPECT_EQ(run.metrics.generated_tokens_total,
              schedule == Schedule::kStatic ? padded : totals_of(items).output_tokens) << schedule_name(schedule);
  }
}

TEST_F(RemoteBenchTest, CountsMatchTheWorkload) {
  test_util::TestServer server(*synth_->model, *synth_->tokenizer);
  const std::vector<WorkItem> items = make_workload(small_workload(6), synth_->tokenizer.get());
  const HttpLoadRun run = run_http_load(remote(server.url()), items);
  EXPECT_EQ(run.model, "tiny");  // asked of /v1/models
  const ServingSummary s = summarize(run.timings);
  EXPECT_EQ(s.requests, 6);
  EXPECT_EQ(s.output_tokens, totals_of(items).output_tokens);
  EXPECT_EQ(run.requests_with_usage, 6);
  EXPECT_EQ(run.reported_prompt_tokens, totals_of(items).prompt_tokens);  // the same tokenizer on both sides
  for (const RequestTiming& t : run.timings) {
    EXPECT_GT(t.first_token_s - t.arrival_s, 0);
    EXPECT_GE(t.finish_s, t.first_token_s);
  }
  EXPECT_GT(s.ttft_ms.mean, 0);
  EXPECT_GT(s.output_tokens_per_s, 0);
  EXPECT_EQ(server.metrics()["kvserve_requests_finished_total"], 6);
}

TEST_F(RemoteBenchTest, CommandLinePrintsTheReport) {
  test_util::TestServer server(*synth_->model, *synth_->tokenizer);
  const auto r = test_util::run_kvserve("bench --serving --url " + server.url() + " -m " + synth_->file.path() +
                                        " --requests 4 --concurrency 2 -p 16 -n 6 --shared-prefix 4 --timeout 30");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model tiny"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| server (HTTP)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ITL ms"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
}

TEST_F(RemoteBenchTest, UnreachableServerFailsWithAClearMessage) {
  std::string url;
  {
    test_util::TestServer gone(*synth_->model, *synth_->tokenizer);
    url = gone.url();
  }  // stopped: nothing listens on its port now
  const auto r = test_util::run_kvserve("bench --serving --url " + url + " --requests 2 --timeout 5");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot connect to GET " + url + "/v1/models"), std::string::npos) << r.output;
  const auto bad_url = test_util::run_kvserve("bench --serving --url localhost:1 --requests 2");
  EXPECT_EQ(bad_url.exit_code, 1);
  EXPECT_NE(bad_url.output.find("must start with http://"), std::string::npos) << bad_url.output;
}

TEST_F(RemoteBenchTest, HttpErrorFailsWithTheServersMessage) {
  test_util::TestServer server(*synth_->model, *synth_->tokenizer, {}, {"sekret"});
  const std::vector<WorkItem> items = make_workload(small_workload(2), synth_->tokenizer.get());
  HttpLoadOptions o = remote(server.url());
  const std::string no_key = remote_error(o, items);
  EXPECT_NE(no_key.find("HTTP 401"), std::string::npos) << no_key;
  EXPECT_NE(no_key.find("--api-key"), std::string::npos) << no_key;
  o.model = "tiny";  // skips /v1/models: the completion request itself gets the 401
  EXPECT_NE(remote_error(o, items).find("POST " + server.url() + "/v1/completions: HTTP 401"), std::string::npos);
  o.client.api_key = "sekret";
  EXPECT_EQ(remote_error(o, items), "");
  WorkloadOptions too_long = small_workload(1);
  too_long.max_output = 4000;  // at least 250 tokens: beyond the tiny model's 256-token context: a 400 naming max_tokens
  const std::string e = remote_error(o, make_workload(too_long, synth_->tokenizer.get()));
  EXPECT_NE(e.find("HTTP 400"), std::string::npos) << e;
  EXPECT_NE(e.find("max_tokens"), std::string::npos) << e;
}

TEST_F(RemoteBenchTest, MalformedOrCutStreamsFailWithAClearMessage) {
  const std::vector<WorkItem> items = make_workload(small_workload(2), nullptr);
  const std::string chunk = R"(data: {"choices": [{"index": 0, "text": "x", "finish_reason": null}]})";
  struct Case {
    std::string body, expected;
  };
  for (const Case& c : std::vector<Case>{
           {chunk + "\n\ndata: not json\n\n", "malformed SSE"},
           {chunk + "\n\ndata: {\"choices\": 5}\n\n", "`choices` is not a list"},
           {"data: {\"error\": {\"message\": \"out of memory\"}}\n\n", "error mid-stream: out of memory"},
           {chunk + "\n\n", "ended before `data: [DONE]`"},
           {chunk + "\n\ndata: {\"cho", "the last one incomplete"},
       }) {
    FakeServer fake([&](const httplib::Request&, httplib::Response& res) { answer_sse(res, c.body); });
    const std::string e = remote_error(remote(fake.url(), 1), items);
    EXPECT_NE(e.find(c.expected), std::string::npos) << c.body << " -> " << e;
  }
  FakeServer not_streaming([&](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"choices": [{"text": "x", "finish_reason": "length"}]})", "application/json");
  });
  EXPECT_NE(remote_error(remote(not_streaming.url(), 1), items).find("the answer is not a stream (Content-Type: application/json)"),
            std::string::npos);
  // Without usage, tokens are counted one per text chunk; a finish_reason without [DONE] is accepted.
  FakeServer plain([&](const httplib::Request&, httplib::Response& res) {
    answer_sse(res, chunk + "\n\n" + chunk + "\n\n" + R"(data: {"choices": [{"text": "", "finish_reason": "length"}]})" "\n\n");
  });
  const HttpLoadRun run = run_http_load(remote(plain.url(), 2), items);
  EXPECT_EQ(run.model, "fake");
  EXPECT_EQ(summarize(run.timings).output_tokens, 4);
  EXPECT_EQ(run.requests_with_usage, 0);
}

TEST_F(RemoteBenchTest, AServerThatNeverAnswersTimesOut) {
  std::atomic<bool> release{false};
  FakeServer silent([&](const httplib::Request&, httplib::Response& res) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    answer_sse(res, "data: [DONE]\n\n");
  });
  HttpLoadOptions o = remote(silent.url(), 1);
  o.client.timeout_s = 0.5;
  const auto start = std::chrono::steady_clock::now();
  const std::string e = remote_error(o, make_workload(small_workload(1), nullptr));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  release = true;
  EXPECT_NE(e.find("no answer from POST " + silent.url() + "/v1/completions"), std::string::npos) << e;
  EXPECT_LT(waited, 10);
}

// Many models behind one server (serve -m A -m B, --models-dir; docs/server.md "Many models"): the ModelRouter's
// loading on demand, LRU unloading of idle models under --models-max, 404s naming the available models, a corrupt
// file's error, explicit load / unload, and that a model's answers are those of a one-model server over its file.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/model_memory.h"
#include "server/model_router.h"
#include "server_harness.h"
#include "test_util.h"

namespace kvserve {
namespace {

using json = nlohmann::json;
using test_util::TestServer;

// A folder holding tiny-llama.gguf, tiny-qwen2.gguf and a corrupt broken.gguf.
struct ModelsDir {
  ModelsDir() {
    static int counter = 0;
    dir = std::filesystem::temp_directory_path() /
          ("kvserve_router_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(dir);
    test_util::write_synth_model(path("tiny-llama"), "tiny-llama");
    test_util::write_synth_model(path("tiny-qwen2"), "tiny-qwen2");
    std::ofstream(path("broken"), std::ios::binary) << "GGUF but not really a model file";
    std::ofstream(dir / "notes.txt") << "not a model";
  }
  ~ModelsDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  std::string path(const std::string& id) const { return (dir / (id + ".gguf")).string(); }
  std::filesystem::path dir;
};

EngineOptions small_engine() {
  EngineOptions o;
  o.max_context = 256;
  o.max_running = 4;
  o.kv_memory_bytes = int64_t{8} << 20;
  return o;
}

server::RouterLimits limits_of(size_t max_loaded, std::chrono::milliseconds slot_wait);

// An ApiServer over a ModelRouter on a free loopback port.
class RouterServer {
 public:
  RouterServer(std::vector<server::ModelSource> sources, size_t max_loaded,
               std::chrono::milliseconds slot_wait = std::chrono::seconds(60))
      : RouterServer(std::move(sources), limits_of(max_loaded, slot_wait)) {}
  RouterServer(std::vector<server::ModelSource> sources, server::RouterLimits limits) {
    server::ServerOptions options;
    options.port = 0;
    server_ = std::make_unique<server::ApiServer>(std::move(sources), limits, ModelLoadOptions{}, small_engine(),
                                                  options);
    port_ = server_->bind();
    listener_ = std::thread([this] { server_->listen(); });
    client().Get("/health");
  }
  ~RouterServer() {
    server_->shutdown();
    listener_.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  json get(const std::string& path) const {
    auto r = client().Get(path);
    return r ? json::parse(r->body) : json();
  }
  httplib::Result post(const std::string& path, const json& body) const {
    return client().Post(path, body.dump(), "application/json");
  }
  // Requests running or waiting in a loaded model's engine, from its labelled /metrics series.
  int leases_out(const std::string& id) const {
    auto r = client().Get("/metrics");
    if (!r) return -1;
    const std::string running = "kvserve_requests_running{model=\"" + id + "\"} ";
    const std::string waiting = "kvserve_requests_waiting{model=\"" + id + "\"} ";
    int n = 0;
    std::istringstream lines(r->body);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(running, 0) == 0) n += std::stoi(line.substr(running.size()));
      if (line.rfind(waiting, 0) == 0) n += std::stoi(line.substr(waiting.size()));
    }
    return n;
  }
  // id -> "loaded" / "unloaded" / "loading", from /v1/models.
  std::map<std::string, std::string> statuses() const {
    std::map<std::string, std::string> out;
    const json models = get("/v1/models");
    for (const json& m : models["data"]) out[m["id"].get<std::string>()] = m["status"]["value"].get<std::string>();
    return out;
  }
  // A sample's value ("name" or "name{labels}"); -1 when /metrics has none.
  double metric(const std::string& name) const {
    auto r = client().Get("/metrics");
    if (!r) return -1;
    const size_t at = r->body.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::stod(r->body.substr(at + name.size() + 2));
  }
  std::string metrics_text() const {
    auto r = client().Get("/metrics");
    return r ? r->body : "";
  }

 private:
  std::unique_ptr<server::ApiServer> server_;
  std::thread listener_;
  int port_ = 0;
};

server::RouterLimits limits_of(size_t max_loaded, std::chrono::milliseconds slot_wait) {
  server::RouterLimits limits;
  limits.max_loaded = max_loaded;
  limits.slot_wait = slot_wait;
  return limits;
}

std::vector<server::ModelSource> two_models(const ModelsDir& d) {
  return {{"tiny-llama", d.path("tiny-llama")}, {"tiny-qwen2", d.path("tiny-qwen2")}};
}

json completion(const std::string& model, int max_tokens = 12) {
  return {{"model", model}, {"prompt", "Hello there"}, {"max_tokens", max_tokens}, {"temperature", 0},
          {"ignore_eos", true}};
}

std::string text_of(const httplib::Result& r) {
  if (!r || r->status != 200) {
    ADD_FAILURE() << (r ? r->body : std::string("no answer"));
    return "";
  }
  return json::parse(r->body)["choices"][0]["text"];
}

// What a one-model server over this file answers.
std::string one_model_answer(const std::string& path, int max_tokens = 12) {
  auto model = Model::load(path);
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  TestServer one(*model, tokenizer, small_engine());
  return text_of(one.client().Post("/v1/completions", completion("whatever", max_tokens).dump(), "application/json"));
}

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

class ModelRouterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { signal(SIGPIPE, SIG_IGN); }
  ModelsDir dir_;
};

TEST_F(ModelRouterTest, ModelsDirListsEveryGgufUnloaded) {
  RouterServer s(server::models_in_dir(dir_.dir.string()), 1);
  EXPECT_EQ(s.statuses(), (std::map<std::string, std::string>{
                              {"broken", "unloaded"}, {"tiny-llama", "unloaded"}, {"tiny-qwen2", "unloaded"}}));
  const json tags = s.get("/api/tags");
  ASSERT_EQ(tags["models"].size(), 3u);
  EXPECT_EQ(tags["models"][1]["name"], "tiny-llama:latest");
  EXPECT_TRUE(s.get("/api/ps")["models"].empty());
  EXPECT_EQ(s.metric("kvserve:models_loaded"), 0);
}

TEST_F(ModelRouterTest, AlternatingRequestsLoadAndUnloadUnderModelsMaxOne) {
  const std::string llama = one_model_answer(dir_.path("tiny-llama"));
  const std::string qwen = one_model_answer(dir_.path("tiny-qwen2"));
  ASSERT_NE(llama, qwen);
  RouterServer s(two_models(dir_), 1);
  EXPECT_EQ(text_of(s.post("/v1/completions", completion("tiny-llama"))), llama);
  EXPECT_EQ(s.statuses(), (std::map<std::string, std::string>{{"tiny-llama", "loaded"}, {"tiny-qwen2", "unloaded"}}));
  EXPECT_EQ(text_of(s.post("/v1/completions", completion("tiny-qwen2"))), qwen);
  EXPECT_EQ(s.statuses(), (std::map<std::string, std::string>{{"tiny-llama", "unloaded"}, {"tiny-qwen2", "loaded"}}));
  EXPECT_EQ(text_of(s.post("/v1/completions", completion("tiny-llama:latest"))), llama);  // Ollama's spelling too
  EXPECT_EQ(s.metric("kvserve:model_loads_total"), 3);
  EXPECT_EQ(s.metric("kvserve:model_unloads_total"), 2);
  EXPECT_EQ(s.metric("kvserve:models_loaded"), 1);
  // A request naming no model goes to the loaded one: no load.
  json unnamed = completion("");
  unnamed.erase("model");
  EXPECT_EQ(text_of(s.post("/v1/completions", unnamed)), llama);
  EXPECT_EQ(s.metric("kvserve:model_loads_total"), 3);
}

TEST_F(ModelRouterTest, TwoSlotsKeepBothLoadedAndUnloadTheLeastRecentlyUsed) {
  RouterServer s(server::models_in_dir(dir_.dir.string()), 2);
  text_of(s.post("/v1/completions", completion("tiny-llama")));
  text_of(s.post("/v1/completions", completion("tiny-qwen2")));
  text_of(s.post("/v1/completions", completion("tiny-llama")));  // qwen2 is now the least recently used
  EXPECT_EQ(s.metric("kvserve:model_loads_total"), 2);
  EXPECT_EQ(s.metric("kvserve:model_unloads_total"), 0);
  ASSERT_EQ(s.post("/models/unload", {{"model", "tiny-qwen2"}})->status, 200);
  EXPECT_EQ(s.statuses().at("tiny-qwen2"), "unloaded");
  EXPECT_EQ(s.statuses().at("tiny-llama"), "loaded");
}

TEST_F(ModelRouterTest, UnknownModelIs404NamingTheAvailableOnes) {
  RouterServer s(two_models(dir_), 1);
  for (const char* path : {"/v1/completions", "/v1/chat/completions", "/api/chat", "/api/generate", "/models/load"}) {
    auto r = s.post(path, {{"model", "nope"}, {"prompt", "x"}, {"messages", json::array({{{"role", "user"}, {"content", "x"}}})}});
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path << ": " << r->body;
    EXPECT_NE(r->body.find("tiny-llama"), std::string::npos) << path << ": " << r->body;
    EXPECT_NE(r->body.find("tiny-qwen2"), std::string::npos) << path << ": " << r->body;
  }
  EXPECT_EQ(s.metric("kvserve:model_loads_total"), 0);
}

TEST_F(ModelRouterTest, CorruptFileFailsItsRequestsOnlyAndIsRetried) {
  const std::string llama = one_model_answer(dir_.path("tiny-llama"));
  RouterServer s(server::models_in_dir(dir_.dir.string()), 1);
  EXPECT_EQ(text_of(s.post("/v1/completions", completion("tiny-llama"))), llama);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto r = s.post("/v1/completions", completion("broken"));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 500) << r->body;
    const std::string message = json::parse(r->body)["error"]["message"];
    EXPECT_NE(message.find("model \"broken\" failed to load from " + dir_.path("broken")), std::string::npos) << message;
    EXPECT_EQ(s.statuses().at("broken"), "unloaded");
    EXPECT_EQ(text_of(s.post("/v1/completions", completion("tiny-llama"))), llama);
  }
  EXPECT_EQ(s.metric("kvserve:model_load_failures_total"), 2);
}

TEST_F(ModelRouterTest, RequestsToALoadedModelRunOnWhileAnotherIsRequested) {
  const std::string llama_long = one_model_answer(dir_.path("tiny-llama"), 120);
  const std::string qwen = one_model_answer(dir_.path("tiny-qwen2"));
  RouterServer s(two_models(dir_), 1);
  ASSERT_EQ(s.post("/models/load", {{"model", "tiny-llama"}})->status, 200);
  // Concurrent requests to tiny-llama while tiny-qwen2 is asked for: they run; qwen2 waits for llama to go idle.
  std::vector<std::string> llama_answers(3);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < llama_answers.size(); ++i)
    threads.emplace_back([&, i] { llama_answers[i] = text_of(s.post("/v1/completions", completion("tiny-llama", 120))); });
  // All three hold tiny-llama before qwen2 asks (one that came later would wait behind qwen2: the router's fairness).
  for (int i = 0; i < 2000 && s.leases_out("tiny-llama") < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::string qwen_answer;
  threads.emplace_back([&] { qwen_answer = text_of(s.post("/v1/completions", completion("tiny-qwen2"))); });
  for (std::thread& t : threads) t.join();
  for (const std::string& a : llama_answers) EXPECT_EQ(a, llama_long);
  EXPECT_EQ(qwen_answer, qwen);
  EXPECT_EQ(s.statuses().at("tiny-qwen2"), "loaded");
}

TEST_F(ModelRouterTest, TwoSlotsServeBothModelsConcurrently) {
  const std::string llama = one_model_answer(dir_.path("tiny-llama"), 60);
  const std::string qwen = one_model_answer(dir_.path("tiny-qwen2"), 60);
  RouterServer s(two_models(dir_), 2);
  std::vector<std::string> answers(6);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < answers.size(); ++i)
    threads.emplace_back([&, i] {
      answers[i] = text_of(s.post("/v1/completions", completion(i % 2 ? "tiny-qwen2" : "tiny-llama", 60)));
    });
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < answers.size(); ++i) EXPECT_EQ(answers[i], i % 2 ? qwen : llama) << i;
  EXPECT_EQ(s.metric("kvserve:model_loads_total"), 2);
}

TEST_F(ModelRouterTest, ExplicitLoadUnloadAndOllamaKeepAliveZero) {
  RouterServer s(two_models(dir_), 2);
  auto r = s.post("/models/load", {{"model", "tiny-qwen2"}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(s.statuses().at("tiny-qwen2"), "loaded");
  EXPECT_EQ(s.get("/api/ps")["models"].size(), 1u);
  r = s.post("/models/unload", {{"model", "tiny-qwen2"}});
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(json::parse(r->body)["status"], "unloaded");
  EXPECT_EQ(s.statuses().at("tiny-qwen2"), "unloaded");
  EXPECT_EQ(json::parse(s.post("/models/unload", {{"model", "tiny-qwen2"}})->body)["status"], "not loaded");
  EXPECT_EQ(s.post("/models/unload", json::object())->status, 400);
  // Ollama: a request with no prompt loads; keep_alive 0 unloads.
  r = s.post("/api/generate", {{"model", "tiny-llama"}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["done_reason"], "load");
  EXPECT_EQ(s.statuses().at("tiny-llama"), "loaded");
  r = s.post("/api/chat", {{"model", "tiny-llama"}, {"messages", json::array()}, {"keep_alive", 0}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["done_reason"], "unload");
  EXPECT_EQ(s.statuses().at("tiny-llama"), "unloaded");
}

// The router itself: a lease keeps its model busy; a request for another model waits for it, or gets a 503.
TEST_F(ModelRouterTest, ABusyModelKeepsItsSlotUntilItsLeaseEnds) {
  server::ModelLoader loader = [](const server::ModelSource& source) {
    return server::ServedModel::load(source.id, source.path, {}, small_engine(), {});
  };
  server::RouterLimits limits;
  limits.slot_wait = std::chrono::milliseconds(200);
  server::ModelRouter router(two_models(dir_), limits, loader);
  server::ModelRouter::Lease llama = router.acquire("tiny-llama");
  const server::ApiError timed_out = test_util::api_error_of([&] { router.acquire("tiny-qwen2"); });
  EXPECT_EQ(timed_out.status(), 503);
  EXPECT_NE(std::string(timed_out.what()).find("--models-max"), std::string::npos) << timed_out.what();

  server::ModelRouter patient(two_models(dir_), {}, loader);  // waits up to 5 minutes
  llama = patient.acquire("tiny-llama");
  std::atomic<bool> got_qwen{false};
  std::thread waiter([&] {
    server::ModelRouter::Lease qwen = patient.acquire("tiny-qwen2");
    got_qwen = qwen && qwen->id == "tiny-qwen2";
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(got_qwen);  // tiny-llama is busy: qwen2 waits
  EXPECT_EQ(patient.counters().loaded, 1u);
  llama.reset();  // idle now: unloaded, and qwen2 loads
  waiter.join();
  EXPECT_TRUE(got_qwen);
  EXPECT_EQ(patient.counters().loads, 2u);
  EXPECT_EQ(patient.counters().unloads, 1u);
  // An unload asked while busy happens when the last lease ends.
  server::ModelRouter::Lease qwen = patient.acquire("tiny-qwen2");
  EXPECT_EQ(patient.unload("tiny-qwen2"), "unloading");
  EXPECT_EQ(patient.counters().loaded, 1u);
  qwen.reset();
  EXPECT_EQ(patient.counters().loaded, 0u);
  EXPECT_EQ(patient.counters().unloads, 2u);
}

// Fairness: a request for a loaded model that arrives while another waits for room waits behind it, so a model
// with a steady stream of requests cannot keep its slot for ever (the requests run in arrival order).
TEST_F(ModelRouterTest, ARequestWaitingForRoomGoesBeforeLaterRequestsToTheBusyModel) {
  server::ModelLoader loader = [](const server::ModelSource& source) {
    return server::ServedModel::load(source.id, source.path, {}, small_engine(), {});
  };
  server::ModelRouter router(two_models(dir_), {}, loader);  // one slot, waits up to 5 minutes
  server::ModelRouter::Lease first = router.acquire("tiny-llama");
  std::atomic<int> order{0};
  std::atomic<int> qwen_at{0}, later_llama_at{0};
  std::thread qwen_request([&] {
    server::ModelRouter::Lease qwen = router.acquire("tiny-qwen2");
    qwen_at = ++order;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // holds its model a moment, then ends
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // qwen2 is waiting for the slot now
  std::thread later_llama_request([&] {
    server::ModelRouter::Lease llama = router.acquire("tiny-llama");
    later_llama_at = ++order;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(later_llama_at, 0) << "a later request to the busy model went ahead of the one waiting for room";
  first.reset();  // tiny-llama drains: qwen2 loads first, then tiny-llama again for the later request
  qwen_request.join();
  later_llama_request.join();
  EXPECT_EQ(qwen_at, 1);
  EXPECT_EQ(later_llama_at, 2);
  EXPECT_EQ(router.counters().loads, 3u);
  EXPECT_EQ(router.counters().unloads, 2u);
}

TEST_F(ModelRouterTest, UnloadingGivesTheMemoryBack) {
  RouterServer s(two_models(dir_), 1);
  auto cycle = [&] {
    text_of(s.post("/v1/completions", completion("tiny-llama", 4)));
    text_of(s.post("/v1/completions", completion("tiny-qwen2", 4)));
  };
  cycle();
  ASSERT_EQ(s.post("/models/unload", {{"model", "tiny-qwen2"}})->status, 200);
  const size_t start = resident_bytes();
  for (int i = 0; i < 6; ++i) cycle();
  ASSERT_EQ(s.post("/models/unload", {{"model", "tiny-qwen2"}})->status, 200);
  EXPECT_EQ(s.metric("kvserve:models_loaded"), 0);
  // Twelve more loads, each with an 8 MiB KV pool: a leak of the pool or the mapping would show. (Not under
  // the sanitizers, whose run sets KVSERVE_SKIP_SLOW: ASan's quarantine keeps freed memory resident.)
  if (test_util::skip_slow()) return;
  EXPECT_LT(resident_bytes(), start + (size_t{8} << 20)) << "RSS grew from " << start << " to " << resident_bytes();
}

TEST_F(ModelRouterTest, RouterRefusesRepeatedIds) {
  EXPECT_THROW(server::ModelRouter({{"a", "x.gguf"}, {"a", "y.gguf"}}, {}, nullptr), Error);
  EXPECT_THROW(server::ModelRouter(std::vector<server::ModelSource>{}, {}, nullptr), Error);
}

// The larger of each model's estimate (before loading) and measured memory (once loaded), for a budget that holds
// either model but not both.
int64_t one_model_budget(const ModelsDir& d) {
  int64_t largest = 0, smallest = INT64_MAX;
  for (const char* id : {"tiny-llama", "tiny-qwen2"}) {
    const int64_t estimate = server::estimate_model_memory(d.path(id), "", small_engine()).total();
    const int64_t measured = server::ServedModel::load(id, d.path(id), {}, small_engine(), {})->memory().total();
    largest = std::max({largest, estimate, measured});
    smallest = std::min({smallest, estimate, measured});
  }
  EXPECT_LT(largest + (int64_t{1} << 20), largest + smallest) << "the budget would hold both models";
  return largest + (int64_t{1} << 20);
}

server::RouterLimits budget_limits(int64_t budget) {
  server::RouterLimits limits = limits_of(4, std::chrono::seconds(60));  // only the budget limits them
  limits.memory_budget = budget;
  return limits;
}

TEST_F(ModelRouterTest, MemoryBudgetOfOneModelAlternatesThem) {
  const std::string llama = one_model_answer(dir_.path("tiny-llama"));
  const std::string qwen = one_model_answer(dir_.path("tiny-qwen2"));
  const int64_t budget = one_model_budget(dir_);
  RouterServer s(two_models(dir_), budget_limits(budget));
  EXPECT_EQ(s.metric("kvserve:models_memory_budget_bytes"), static_cast<double>(budget));
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(text_of(s.post("/v1/completions", completion("tiny-llama"))), llama);
    EXPECT_EQ(s.statuses(), (std::map<std::string, std::string>{{"tiny-llama", "loaded"}, {"tiny-qwen2", "unloaded"}}));
    EXPECT_LE(s.metric("kvserve:models_memory_used_bytes"), static_cast<double>(budget));
    EXPECT_GT(s.metric("kvserve:models_memory_used_bytes"), 0);
    EXPECT_EQ(text_of(s.post("/v1/completions", completion("tiny-qwen2"))), qwen);
    EXPECT_EQ(s.statuses(), (std::map<std::string, std::string>{{"tiny-llama", "unloaded"}, {"tiny-qwen2", "loaded"}}));
  }
  EXPECT_EQ(s.metric("kvserve:model_loads_total"), 4);
  EXPECT_EQ(s.metric("kvserve:model_unloads_total"), 3);
  // Its engine series are labelled with its id, and its KV blocks all went back after the requests.
  EXPECT_EQ(s.metric("kvserve_kv_blocks_used{model=\"tiny-qwen2\"}"), 0);
  EXPECT_GT(s.metric("kvserve_generation_tokens_total{model=\"tiny-qwen2\"}"), 0);
  EXPECT_EQ(s.metric("kvserve_generation_tokens_total{model=\"tiny-llama\"}"), -1);  // unloaded: no series
}

TEST_F(ModelRouterTest, UnderABudgetConcurrentRequestsMatchAOneModelServer) {
  const std::string llama_long = one_model_answer(dir_.path("tiny-llama"), 120);
  const std::string qwen = one_model_answer(dir_.path("tiny-qwen2"));
  RouterServer s(two_models(dir_), budget_limits(one_model_budget(dir_)));
  ASSERT_EQ(s.post("/models/load", {{"model", "tiny-llama"}})->status, 200);
  std::vector<std::string> llama_answers(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < llama_answers.size(); ++i)
    threads.emplace_back([&, i] { llama_answers[i] = text_of(s.post("/v1/completions", completion("tiny-llama", 120))); });
  // All three hold tiny-llama before qwen2 asks (one that came later would wait behind qwen2: the router's fairness).
  for (int i = 0; i < 2000 && s.leases_out("tiny-llama") < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::string qwen_answer;  // waits for memory until tiny-llama is idle
  threads.emplace_back([&] { qwen_answer = text_of(s.post("/v1/completions", completion("tiny-qwen2"))); });
  for (std::thread& t : threads) t.join();
  for (const std::string& a : llama_answers) EXPECT_EQ(a, llama_long);
  EXPECT_EQ(qwen_answer, qwen);
  EXPECT_EQ(s.statuses(), (std::map<std::string, std::string>{{"tiny-llama", "unloaded"}, {"tiny-qwen2", "loaded"}}));
}

TEST_F(ModelRouterTest, AModelLargerThanTheBudgetIsAnErrorAndTheOthersGoOn) {
  std::vector<server::ModelSource> sources = two_models(dir_);
  sources[1].options.kv_mem_mib = 64;  // tiny-qwen2 with a 64 MiB pool: more than the budget
  const std::string llama = one_model_answer(dir_.path("tiny-llama"));
  RouterServer s(std::move(sources), budget_limits(one_model_budget(dir_)));
  EXPECT_EQ(text_of(s.post("/v1/completions", completion("tiny-llama"))), llama);
  auto r = s.post("/v1/completions", completion("tiny-qwen2"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500) << r->body;
  const std::string message = json::parse(r->body)["error"]["message"];
  EXPECT_NE(message.find("model \"tiny-qwen2\" needs "), std::string::npos) << message;
  EXPECT_NE(message.find("KV pool 64.0 MiB"), std::string::npos) << message;
  EXPECT_NE(message.find("more than --models-memory"), std::string::npos) << message;
  EXPECT_EQ(s.statuses().at("tiny-llama"), "loaded");  // nothing was unloaded for it
  EXPECT_EQ(text_of(s.post("/v1/completions", completion("tiny-llama"))), llama);
  EXPECT_EQ(s.metric("kvserve:model_load_failures_total"), 1);
}

TEST_F(ModelRouterTest, BusyModelsHoldingTheBudgetGiveA503AfterTheWait) {
  server::ModelLoader loader = [](const server::ModelSource& source) {
    return server::ServedModel::load(source.id, source.path, {}, small_engine(), {});
  };
  server::ModelSizer sizer = [](const server::ModelSource& source) {
    return server::estimate_model_memory(source.path, "", small_engine());
  };
  server::RouterLimits limits = budget_limits(one_model_budget(dir_));
  limits.slot_wait = std::chrono::milliseconds(200);
  server::ModelRouter router(two_models(dir_), limits, loader, sizer);
  server::ModelRouter::Lease llama = router.acquire("tiny-llama");
  const server::ApiError timed_out = test_util::api_error_of([&] { router.acquire("tiny-qwen2"); });
  EXPECT_EQ(timed_out.status(), 503);
  EXPECT_NE(std::string(timed_out.what()).find("busy models hold"), std::string::npos) << timed_out.what();
  llama.reset();
  EXPECT_EQ(router.acquire("tiny-qwen2")->id, "tiny-qwen2");
  EXPECT_THROW(server::ModelRouter(two_models(dir_), limits, loader), Error);  // a budget needs a sizer
}

TEST_F(ModelRouterTest, UnloadingUnderABudgetGivesTheMemoryBack) {
  RouterServer s(two_models(dir_), budget_limits(one_model_budget(dir_)));
  auto cycle = [&] {
    text_of(s.post("/v1/completions", completion("tiny-llama", 4)));
    text_of(s.post("/v1/completions", completion("tiny-qwen2", 4)));
  };
  cycle();
  ASSERT_EQ(s.post("/models/unload", {{"model", "tiny-qwen2"}})->status, 200);
  EXPECT_EQ(s.metric("kvserve:models_memory_used_bytes"), 0);
  const size_t start = resident_bytes();
  for (int i = 0; i < 6; ++i) cycle();
  ASSERT_EQ(s.post("/models/unload", {{"model", "tiny-qwen2"}})->status, 200);
  EXPECT_EQ(s.metric("kvserve:models_loaded"), 0);
  EXPECT_EQ(s.metric("kvserve:models_memory_used_bytes"), 0);
  EXPECT_EQ(s.metric("kvserve:model_unloads_total"), 14);
  if (test_util::skip_slow()) return;  // ASan's quarantine keeps freed memory resident (as above)
  EXPECT_LT(resident_bytes(), start + (size_t{8} << 20)) << "RSS grew from " << start << " to " << resident_bytes();
}

// Polls /v1/models until the model has this status (or 20 s pass); keep_alive timing is never asserted tightly.
bool wait_for_status(const RouterServer& s, const std::string& id, const std::string& status) {
  for (int i = 0; i < 200; ++i) {
    if (s.statuses().at(id) == status) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST_F(ModelRouterTest, IdleModelsAreUnloadedAfterTheDefaultKeepAlive) {
  server::RouterLimits limits = limits_of(2, std::chrono::seconds(60));
  limits.keep_alive = std::chrono::milliseconds(200);
  RouterServer s(two_models(dir_), limits);
  text_of(s.post("/v1/completions", completion("tiny-llama", 4)));
  EXPECT_TRUE(wait_for_status(s, "tiny-llama", "unloaded"));
  EXPECT_EQ(s.metric("kvserve:model_unloads_total"), 1);
  // A request's keep_alive wins: -1 keeps it loaded past the default.
  ASSERT_EQ(s.post("/api/generate", {{"model", "tiny-qwen2"}, {"keep_alive", -1}})->status, 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  EXPECT_EQ(s.statuses().at("tiny-qwen2"), "loaded");
  EXPECT_EQ(s.get("/api/ps")["models"][0]["expires_at"], "9999-12-31T23:59:59Z");
}

TEST_F(ModelRouterTest, RequestKeepAliveSetsWhenItsModelIsUnloaded) {
  RouterServer s(two_models(dir_), 2);  // the default: kept until unloaded
  json chat = {{"model", "tiny-llama"}, {"stream", false}, {"options", {{"num_predict", 4}}},
               {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}, {"keep_alive", "30m"}};
  ASSERT_EQ(s.post("/api/chat", chat)->status, 200);
  const json ps = s.get("/api/ps");
  ASSERT_EQ(ps["models"].size(), 1u);
  EXPECT_NE(ps["models"][0]["expires_at"], "9999-12-31T23:59:59Z");  // in half an hour
  chat["keep_alive"] = "300ms";
  ASSERT_EQ(s.post("/api/chat", chat)->status, 200);
  EXPECT_TRUE(wait_for_status(s, "tiny-llama", "unloaded"));
  chat["keep_alive"] = 0;  // generates, then unloads as soon as its request ends
  ASSERT_EQ(s.post("/api/chat", chat)->status, 200);
  EXPECT_EQ(s.statuses().at("tiny-llama"), "unloaded");
  chat["keep_alive"] = "soon";
  EXPECT_EQ(s.post("/api/chat", chat)->status, 400);
  // kvserve's extension: the OpenAI paths take keep_alive too.
  json openai = completion("tiny-qwen2", 4);
  openai["keep_alive"] = 0;
  text_of(s.post("/v1/completions", openai));
  EXPECT_EQ(s.statuses().at("tiny-qwen2"), "unloaded");
  openai["keep_alive"] = json::array();
  EXPECT_EQ(s.post("/v1/completions", openai)->status, 400);
  // And Anthropic's Messages and OpenAI's Responses paths.
  const json messages = {{"model", "tiny-llama"}, {"max_tokens", 4}, {"keep_alive", 0},
                         {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}};
  ASSERT_EQ(s.post("/v1/messages", messages)->status, 200);
  EXPECT_EQ(s.statuses().at("tiny-llama"), "unloaded");
  json responses = {{"model", "tiny-qwen2"}, {"max_output_tokens", 4}, {"input", "Hi"}, {"keep_alive", "30m"}};
  ASSERT_EQ(s.post("/v1/responses", responses)->status, 200);
  EXPECT_NE(s.get("/api/ps")["models"][0]["expires_at"], "9999-12-31T23:59:59Z");
  responses["keep_alive"] = 0;
  ASSERT_EQ(s.post("/v1/responses", responses)->status, 200);
  EXPECT_EQ(s.statuses().at("tiny-qwen2"), "unloaded");
  responses["keep_alive"] = "soon";
  EXPECT_EQ(s.post("/v1/responses", responses)->status, 400);
}

TEST_F(ModelRouterTest, MetricsLabelEachLoadedModelsEngineSeries) {
  RouterServer s(two_models(dir_), 2);
  text_of(s.post("/v1/completions", completion("tiny-llama", 5)));
  text_of(s.post("/v1/completions", completion("tiny-qwen2", 7)));
  EXPECT_EQ(s.metric("kvserve_generation_tokens_total{model=\"tiny-llama\"}"), 5);
  EXPECT_EQ(s.metric("kvserve_generation_tokens_total{model=\"tiny-qwen2\"}"), 7);
  EXPECT_EQ(s.metric("vllm:num_requests_running{model=\"tiny-qwen2\",model_name=\"tiny-qwen2\"}"), 0);
  EXPECT_GT(s.metric("kvserve:model_memory_bytes{model=\"tiny-llama\"}"), 0);
  const std::string text = s.metrics_text();
  size_t families = 0;
  for (size_t at = text.find("# TYPE kvserve_generation_tokens_total "); at != std::string::npos;
       at = text.find("# TYPE kvserve_generation_tokens_total ", at + 1))
    ++families;
  EXPECT_EQ(families, 1u) << text;  // one family, a sample per model
  EXPECT_NE(text.find("\nkvserve_requests_rejected_total 0\n"), std::string::npos);  // the server's own: unlabelled
}

TEST_F(ModelRouterTest, PresetAliasesAndOptionsAreServed) {
  std::vector<server::ModelSource> sources = {{"chat", dir_.path("tiny-llama")}, {"story", dir_.path("tiny-qwen2")}};
  sources[0].options.context = 64;
  const std::string llama = one_model_answer(dir_.path("tiny-llama"));
  RouterServer s(std::move(sources), 2);
  EXPECT_EQ(s.statuses(), (std::map<std::string, std::string>{{"chat", "unloaded"}, {"story", "unloaded"}}));
  EXPECT_EQ(s.get("/api/tags")["models"][0]["name"], "chat:latest");
  EXPECT_EQ(text_of(s.post("/v1/completions", completion("chat"))), llama);
  EXPECT_EQ(s.get("/v1/models")["data"][0]["meta"]["context_length"], 64);
  auto r = s.post("/v1/completions", completion("chat", 100));  // 64 tokens of context: too long
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
}

}  // namespace
}  // namespace kvserve

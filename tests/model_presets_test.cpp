// The many-model server's plain parts: the presets file (server/model_presets.h) with good, bad and hostile
// files, Ollama's keep_alive durations (server/keep_alive.h), and the per-model /metrics merge
// (server/metric_labels.h).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "server/keep_alive.h"
#include "server/metric_labels.h"
#include "server/model_presets.h"

namespace kvserve {
namespace {

using server::KeepAlive;
using server::ModelPresets;

ModelPresets presets_of(const std::string& text) { return server::parse_model_presets(text, "p.ini", "/models"); }

// The message of the kvserve::Error parsing `text` throws ("" when it parses).
std::string preset_error(const std::string& text) {
  try {
    presets_of(text);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a kvserve::Error: " << e.what();
  }
  return "";
}

TEST(ModelPresets, ParsesSectionsOptionsAndDefaults) {
  const ModelPresets p = presets_of(
      "version = 1\n"
      "; a comment\n"
      "[*]\n"
      "ctx-size = 2048\n"
      "threads = 2\n"
      "\n"
      "[chat]\n"
      "model = smollm2.gguf\n"
      "kv-type = q8_0\n"
      "c = 1024\n"
      "  # indented comment\n"
      "[coder:1.5b]\n"
      "model = \"/abs/coder.gguf\"\n"
      "draft = small.gguf\n"
      "spec = draft\n"
      "draft-k = 6\n"
      "kv-mem = 64\n"
      "[tiny]\r\n"
      "t = 1\r\n");
  EXPECT_EQ(p.defaults.context, 2048);
  EXPECT_EQ(p.defaults.threads, 2);
  ASSERT_EQ(p.models.size(), 3u);
  EXPECT_EQ(p.models[0].id, "chat");
  EXPECT_EQ(p.models[0].path, "/models/smollm2.gguf");  // relative to the file's folder
  EXPECT_EQ(p.models[0].options.kv_type, "q8_0");
  EXPECT_EQ(p.models[0].options.context, 1024);
  EXPECT_EQ(p.models[0].line, 7);
  EXPECT_EQ(p.models[1].id, "coder:1.5b");
  EXPECT_EQ(p.models[1].path, "/abs/coder.gguf");
  EXPECT_EQ(p.models[1].options.draft, "/models/small.gguf");
  EXPECT_EQ(p.models[1].options.spec, "draft");
  EXPECT_EQ(p.models[1].options.draft_k, 6);
  EXPECT_EQ(p.models[1].options.kv_mem_mib, 64);
  EXPECT_EQ(p.models[2].path, "");  // options for a model -m or --models-dir serves
  EXPECT_EQ(p.models[2].options.threads, 1);
  const server::ModelOptions merged = p.models[0].options.or_else(p.defaults);
  EXPECT_EQ(merged.context, 1024);
  EXPECT_EQ(merged.threads, 2);
}

TEST(ModelPresets, BadFilesNameTheLineAndKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"[a]\nctx = 5\n", "p.ini:2: unknown key \"ctx\" in [a]"},
      {"[a]\nc = lots\n", "p.ini:2: c = lots: expected an integer"},
      {"[a]\nc = 99999999999999999999999\n", "p.ini:2: c = 99999999999999999999999: expected an integer"},
      {"[a]\nc = 4096x\n", "p.ini:2: c = 4096x"},
      {"[a]\nc = 8\n", "expected an integer in [16,"},
      {"[a]\nkv-type = f12\n", "p.ini:2:"},
      {"[a]\nspec = fast\n", "p.ini:2: spec = fast: expected none, ngram, draft or auto"},
      {"[a]\ndraft-k = 0\n", "p.ini:2: draft-k = 0"},
      {"[a]\nthreads = -1\n", "p.ini:2: threads = -1"},
      {"[a]\nmodel =\n", "p.ini:2: model has no value"},
      {"c = 5\n", "p.ini:1: \"c\" before any [section]"},
      {"[a\n", "p.ini:1: a section line must end with ']'"},
      {"[]\n", "p.ini:1: []: a model id"},
      {"[a b]\n", "p.ini:1: [a b]: a model id"},
      {"[a]\n[b]\n[a]\n", "p.ini:3: [a] again (first at line 1)"},
      {"[*]\nmodel = x.gguf\n", "p.ini:2: [*] cannot name a model file"},
      {"[a]\njust words\n", "p.ini:2: expected [model-id] or key = value"},
      {"", "p.ini: no [model] section"},
      {"[*]\nc = 64\n", "p.ini: no [model] section"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string message = preset_error(text);
    EXPECT_NE(message.find(expected), std::string::npos) << "text: " << text << "\nmessage: " << message;
  }
  EXPECT_NE(preset_error(std::string("[a]\nc = 1\0 2\n", 13)).find("p.ini:2: a NUL byte"), std::string::npos);
}

TEST(ModelPresets, HostileTextOnlyEverThrowsKvserveErrors) {
  const std::string id_too_long = "[" + std::string(129, 'a') + "]\n";
  const std::string hostile[] = {
      id_too_long, std::string(100000, '['), std::string(100000, '='), "[a]\n" + std::string(100000, 'k') + "= 1\n",
      "[a]\n=\n", "[a]\n = 5\n", "[\xff\xfe]\n", "[a]\nmodel = \xff\n", "\xef\xbb\xbf[a]\n", "[a]]\n", "[[a]\n",
      "[a]\nc = +16\n", "[a]\nc = 0x10\n", "[a]\nc = 16.0\n", "[a]\nkv-mem = -1\n", "[a]\nc = 16 # comment\n",
  };
  for (const std::string& text : hostile) preset_error(text);  // a kvserve::Error or nothing; never another exception
  EXPECT_NE(preset_error(id_too_long).find("1 to 128"), std::string::npos);
  EXPECT_NE(preset_error("[a]\nc = 0x10\n").find("c = 0x10"), std::string::npos);
}

TEST(ModelPresets, LoadRefusesMissingAndHugeFiles) {
  try {
    server::load_model_presets("/nonexistent/presets.ini");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--models-preset /nonexistent/presets.ini"), std::string::npos) << e.what();
  }
}

TEST(KeepAliveDuration, ParsesOllamasForms) {
  using std::chrono::milliseconds;
  EXPECT_EQ(server::parse_keep_alive("5m"), milliseconds(300000));
  EXPECT_EQ(server::parse_keep_alive("30s"), milliseconds(30000));
  EXPECT_EQ(server::parse_keep_alive("1h30m"), milliseconds(5400000));
  EXPECT_EQ(server::parse_keep_alive("1.5h"), milliseconds(5400000));
  EXPECT_EQ(server::parse_keep_alive("200ms"), milliseconds(200));
  EXPECT_EQ(server::parse_keep_alive("300"), milliseconds(300000));  // seconds
  EXPECT_EQ(server::parse_keep_alive("0"), milliseconds(0));
  EXPECT_EQ(server::parse_keep_alive("0s"), milliseconds(0));
  EXPECT_EQ(server::parse_keep_alive("-1"), server::kKeepForever);
  EXPECT_EQ(server::parse_keep_alive("-5m"), server::kKeepForever);
  EXPECT_EQ(server::parse_keep_alive("99999999h"), server::kKeepForever);  // past a century: forever
  for (const char* bad : {"", "-", "+", "m5", "5x", "5 m", "1..5s", "five", "5m-", "1e3s", "nan", "inf", "."})
    EXPECT_FALSE(server::parse_keep_alive(bad)) << bad;
  EXPECT_FALSE(server::parse_keep_alive(std::string(65, '1')));
  EXPECT_EQ(server::keep_alive_of_seconds(2.5), milliseconds(2500));
  EXPECT_EQ(server::keep_alive_of_seconds(-1), server::kKeepForever);
  EXPECT_EQ(server::keep_alive_of_seconds(1e300), server::kKeepForever);
  EXPECT_EQ(server::keep_alive_text(milliseconds(300000)), "5m");
  EXPECT_EQ(server::keep_alive_text(server::kKeepForever), "forever");
}

TEST(MetricLabels, MergesFamiliesAndLabelsEverySample) {
  const std::string a =
      "# HELP x_total X.\n# TYPE x_total counter\nx_total 1\n"
      "# HELP h Hist.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_sum 3\nh_count 2\n";
  const std::string b = "# HELP x_total X.\n# TYPE x_total counter\nx_total 5\n# HELP y Y.\n# TYPE y gauge\ny 7\n";
  const std::string merged = server::merge_labelled({{"m1", a}, {"m\"2", b}}, "model");
  EXPECT_EQ(merged,
            "# HELP x_total X.\n# TYPE x_total counter\nx_total{model=\"m1\"} 1\nx_total{model=\"m\\\"2\"} 5\n"
            "# HELP h Hist.\n# TYPE h histogram\nh_bucket{model=\"m1\",le=\"1\"} 2\nh_sum{model=\"m1\"} 3\n"
            "h_count{model=\"m1\"} 2\n"
            "# HELP y Y.\n# TYPE y gauge\ny{model=\"m\\\"2\"} 7\n");
}

}  // namespace
}  // namespace kvserve

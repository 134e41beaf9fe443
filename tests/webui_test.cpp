// The chat page at / (server/webui.h, issue #36): served from the binary,
// byte for byte the files of src/server/webui/, with headers that let it
// load nothing but itself; without an API key (the page asks for it), and
// off with --no-webui (ServerOptions::webui), where / is a 404 like any
// unknown route. The page's behaviour is tested in a browser:
// tests/webui_browser_test.py.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "server/webui.h"
#include "server_harness.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

class WebuiServer : public test_util::SynthModelSuite {
 protected:
  static std::unique_ptr<test_util::TestServer> server(bool webui, std::vector<std::string> api_keys = {},
                                                       std::vector<std::string> cors_origins = {}) {
    server::ServerOptions o;
    o.model_id = "tiny";
    o.webui = webui;
    o.api_keys = std::move(api_keys);
    o.cors_origins = std::move(cors_origins);
    return std::make_unique<test_util::TestServer>(o, *synth_->model, *synth_->tokenizer);
  }
};

std::string webui_source_file(const std::string& name) {
  std::ifstream in(std::string(KVSERVE_SOURCE_DIR) + "/src/server/webui/" + name, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void expect_page_headers(const httplib::Result& r, const std::string& content_type) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), content_type);
  EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff");
  const std::string csp = r->get_header_value("Content-Security-Policy");
  EXPECT_NE(csp.find("default-src 'none'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("connect-src 'self'"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("unsafe"), std::string::npos) << "no inline script or eval: " << csp;
}

}  // namespace

constexpr const char* kWebuiFiles[] = {"index.html", "webui.js", "webui_util.js", "webui.css"};

TEST(WebuiAssets, AreTheSourceFilesByteForByte) {
  EXPECT_EQ(server::webui_assets().size(), std::size(kWebuiFiles));
  for (const char* name : kWebuiFiles) {
    const std::string path = name == std::string("index.html") ? "/" : "/" + std::string(name);
    ASSERT_TRUE(server::is_webui_path(path)) << path;
    for (const server::WebAsset& asset : server::webui_assets()) {
      if (asset.path == path) {
        EXPECT_EQ(asset.body, webui_source_file(name)) << name;
      }
    }
  }
  EXPECT_FALSE(server::is_webui_path("/v1/models"));
  EXPECT_FALSE(server::is_webui_path("/webuiXjs"));
}

// Works offline: nothing in the page names another origin (a CDN, a font service) or pulls in another file.
TEST(WebuiAssets, NameNoOtherOrigin) {
  for (const server::WebAsset& asset : server::webui_assets()) {
    for (const char* outside : {"http:", "https:", "\"//", "'//", "@import", "url("})
      EXPECT_EQ(asset.body.find(outside), std::string_view::npos) << asset.path << " names " << outside;
  }
}

TEST_F(WebuiServer, PageScriptAndStyleAreServedWithTheirHeaders) {
  auto s = server(true);
  auto c = s->client();
  auto page = c.Get("/");
  expect_page_headers(page, "text/html; charset=utf-8");
  EXPECT_EQ(page->body, webui_source_file("index.html"));
  // The CSP forbids inline script and style: the page has neither, only its two files.
  EXPECT_NE(page->body.find(R"(<script type="module" src="/webui.js"></script>)"), std::string::npos);
  EXPECT_NE(page->body.find(R"(<link rel="stylesheet" href="/webui.css">)"), std::string::npos);
  EXPECT_EQ(page->body.find("<style"), std::string::npos);
  EXPECT_EQ(page->body.find(" style="), std::string::npos);
  EXPECT_EQ(page->body.find(" on"), std::string::npos) << "no inline event handlers";
  for (const char* id : {"model", "system", "temperature", "top-p", "max-tokens", "seed", "message", "send", "stop",
                         "messages", "new-chat", "api-key", "model-status"})
    EXPECT_NE(page->body.find("id=\"" + std::string(id) + "\""), std::string::npos) << id;

  for (const char* name : {"webui.js", "webui_util.js"}) {
    auto script = c.Get("/" + std::string(name));
    expect_page_headers(script, "text/javascript; charset=utf-8");
    EXPECT_EQ(script->body, webui_source_file(name));
    EXPECT_EQ(script->body.find("innerHTML"), std::string::npos) << name << ": model text is only ever set as text";
  }
  auto style = c.Get("/webui.css");
  expect_page_headers(style, "text/css; charset=utf-8");
  EXPECT_EQ(style->body, webui_source_file("webui.css"));
}

TEST_F(WebuiServer, ThePageNeedsNoKeyButTheApiStillDoes) {
  auto s = server(true, {"secret"});
  auto c = s->client();
  for (const char* path : {"/", "/webui.js", "/webui_util.js", "/webui.css"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
  }
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);  // the page reads this and asks for the key
  auto with_key = c.Get("/v1/models", {{"Authorization", "Bearer secret"}});
  ASSERT_TRUE(with_key);
  EXPECT_EQ(with_key->status, 200);
  EXPECT_EQ(json::parse(with_key->body)["data"][0]["id"], "tiny");
}

TEST_F(WebuiServer, NoWebuiMakesThePageAnUnknownRoute) {
  auto s = server(false);
  auto c = s->client();
  for (const char* path : {"/", "/webui.js", "/webui_util.js", "/webui.css"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    EXPECT_EQ(json::parse(r->body)["error"]["message"], "no route for GET " + std::string(path));
  }
  // With a key set, the page's paths are no longer exempt from it.
  auto keyed = server(false, {"secret"});
  auto r = keyed->client().Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
}

TEST_F(WebuiServer, ApiRoutesKeepTheirHeadersAndOtherPathsStay404) {
  auto s = server(true, {}, {"http://localhost:3000"});
  auto c = s->client();
  auto models = c.Get("/v1/models", {{"Origin", "http://localhost:3000"}});
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(models->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_FALSE(models->has_header("Content-Security-Policy"));
  EXPECT_EQ(models->get_header_value("Content-Type"), "application/json");
  for (const char* path : {"/webuiXjs", "/index.html", "/webui.js/x"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
  }
}

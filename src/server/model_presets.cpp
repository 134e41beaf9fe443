#include "server/model_presets.h"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/kv_type.h"
#include "speculation/request_speculation.h"

namespace kvserve::server {
namespace {

constexpr size_t kMaxFileBytes = size_t{1} << 20;
constexpr size_t kMaxIdChars = 128;
constexpr const char* kKnownKeys = "model, ctx-size (c), kv-type, kv-mem, threads (t), draft, spec, draft-k";

// Where in the file a line is, for messages: "NAME:LINE: ".
struct Place {
  const std::string& name;
  int line;
  Error error(const std::string& what) const { return Error(name + ":" + std::to_string(line) + ": " + what); }
};

std::string trim(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\r") - first + 1);
}

std::string unquoted(const std::string& v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) return v.substr(1, v.size() - 2);
  return v;
}

bool valid_id(const std::string& id) {
  if (id.empty() || id.size() > kMaxIdChars) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-' || c == ':' || c == '/';
    if (!ok) return false;
  }
  return true;
}

int64_t integer(const Place& at, const std::string& key, const std::string& value, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < lo || v > hi)
    throw at.error(key + " = " + value + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                   "]");
  return v;
}

std::string checked_kv_type(const Place& at, const std::string& value) {
  try {
    parse_kv_type(value, "kv-type");
  } catch (const std::exception& e) {
    throw at.error(e.what());
  }
  return value;
}

std::string checked_spec(const Place& at, const std::string& value) {
  if (value != "none" && value != "ngram" && value != "draft" && value != "auto")
    throw at.error("spec = " + value + ": expected none, ngram, draft or auto");
  return value;
}

std::string resolved_path(const std::string& value, const std::string& folder) {
  const std::filesystem::path p(value);
  return p.is_absolute() || folder.empty() ? value : (std::filesystem::path(folder) / p).string();
}

// One `key = value` of a model's section (or [*], where `model` is not taken).
void set_option(const Place& at, const std::string& key, const std::string& value, const std::string& folder,
                ModelPreset& preset, bool defaults) {
  if (value.empty()) throw at.error(key + " has no value");
  ModelOptions& o = preset.options;
  if ((key == "model" || key == "m") && !defaults) preset.path = resolved_path(value, folder);
  else if (key == "ctx-size" || key == "c") o.context = integer(at, key, value, 16, int64_t{1} << 20);
  else if (key == "kv-type") o.kv_type = checked_kv_type(at, value);
  else if (key == "kv-mem") o.kv_mem_mib = integer(at, key, value, 0, int64_t{1} << 30);
  else if (key == "threads" || key == "t") o.threads = static_cast<int>(integer(at, key, value, 0, 4096));
  else if (key == "draft" || key == "model-draft") o.draft = resolved_path(value, folder);
  else if (key == "spec") o.spec = checked_spec(at, value);
  else if (key == "draft-k") o.draft_k = integer(at, key, value, 1, kMaxEngineDraftK);
  else if (key == "model" || key == "m") throw at.error("[*] cannot name a model file: give each model its section");
  else throw at.error("unknown key \"" + key + "\" in [" + preset.id + "] (known: " + kKnownKeys + ")");
}

// A "[section]" line: the section it opens.
ModelPreset open_section(const Place& at, const std::string& line, const ModelPresets& out) {
  if (line.back() != ']') throw at.error("a section line must end with ']': " + line);
  ModelPreset preset;
  preset.id = trim(line.substr(1, line.size() - 2));
  preset.line = at.line;
  if (preset.id == "*") return preset;
  if (!valid_id(preset.id))
    throw at.error("[" + preset.id + "]: a model id is 1 to 128 letters, digits and . _ - : /");
  for (const ModelPreset& other : out.models)
    if (other.id == preset.id)
      throw at.error("[" + preset.id + "] again (first at line " + std::to_string(other.line) + ")");
  return preset;
}

void close_section(std::optional<ModelPreset>& section, ModelPresets& out) {
  if (!section) return;
  if (section->id == "*") out.defaults = section->options.or_else(out.defaults);
  else out.models.push_back(std::move(*section));
  section.reset();
}

}  // namespace

ModelOptions ModelOptions::or_else(const ModelOptions& f) const {
  return {context ? context : f.context, kv_type ? kv_type : f.kv_type, kv_mem_mib ? kv_mem_mib : f.kv_mem_mib,
          threads ? threads : f.threads,  draft ? draft : f.draft,       spec ? spec : f.spec,
          draft_k ? draft_k : f.draft_k};
}

ModelPresets parse_model_presets(const std::string& text, const std::string& name, const std::string& folder) {
  ModelPresets out;
  std::optional<ModelPreset> section;
  std::istringstream lines(text);
  std::string raw;
  for (int number = 1; std::getline(lines, raw); ++number) {
    const Place at{name, number};
    if (raw.find('\0') != std::string::npos) throw at.error("a NUL byte: not a text file");
    const std::string line = trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line[0] == '[') {
      close_section(section, out);
      section = open_section(at, line, out);
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) throw at.error("expected [model-id] or key = value, got: " + line.substr(0, 80));
    const std::string key = trim(line.substr(0, eq));
    const std::string value = unquoted(trim(line.substr(eq + 1)));
    if (!section) {
      if (key == "version") continue;  // llama-server's files may start with one
      throw at.error("\"" + key + "\" before any [section]");
    }
    set_option(at, key, value, folder, *section, section->id == "*");
  }
  close_section(section, out);
  if (out.models.empty()) throw Error(name + ": no [model] section");
  return out;
}

ModelPresets load_model_presets(const std::string& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (error) throw Error("--models-preset " + path + ": " + error.message());
  if (size > kMaxFileBytes) throw Error("--models-preset " + path + ": larger than 1 MiB, not a presets file");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) throw Error("--models-preset " + path + ": cannot be read");
  const std::string folder = std::filesystem::path(path).parent_path().string();
  return parse_model_presets(text.str(), path, folder);
}

}  // namespace kvserve::server

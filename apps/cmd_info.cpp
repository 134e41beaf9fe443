// `kvserve info MODEL.gguf`: architecture, sizes, tensor types, KV bytes per token.
#include <cstdio>
#include <map>
#include <string>

#include "apps/commands.h"
#include "model/gguf.h"

namespace kvserve::cli {
namespace {

void print_info(const std::string& path) {
  GGUFFile file(path);
  std::printf("file:          %s (%.1f MiB, GGUF v%u)\n", path.c_str(), file.file_size() / 1048576.0, file.version());
  for (const auto& [key, v] : file.metadata()) {
    if (key.rfind("tokenizer.ggml.", 0) == 0 && v.type == GGUFType::ARRAY) {
      std::printf("  %-40s [%zu entries]\n", key.c_str(), v.array_size());
    } else if (v.type == GGUFType::STRING) {
      std::string s = v.str.size() > 60 ? v.str.substr(0, 57) + "..." : v.str;
      for (char& ch : s)
        if (ch == '\n') ch = ' ';
      std::printf("  %-40s %s\n", key.c_str(), s.c_str());
    } else if (v.type == GGUFType::ARRAY) {
      std::printf("  %-40s [%zu entries]\n", key.c_str(), v.array_size());
    } else if (v.is_float()) {
      std::printf("  %-40s %g\n", key.c_str(), v.f);
    } else {
      std::printf("  %-40s %lld\n", key.c_str(), static_cast<long long>(v.i));
    }
  }
  std::map<std::string, std::pair<int, size_t>> by_type;
  for (const auto& t : file.tensors()) {
    auto& e = by_type[dtype_name(t.type)];
    e.first++;
    e.second += t.nbytes;
  }
  if (file.get_bool("kvserve.placeholder_vocab", false)) std::printf("warning:       placeholder vocabulary: text will not decode\n");
  std::printf("tensors:       %zu\n", file.tensors().size());
  for (const auto& [name, e] : by_type)
    std::printf("  %-6s %4d tensors, %.2f MiB\n", name.c_str(), e.first, e.second / 1048576.0);
}

}  // namespace

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print a GGUF model's architecture, sizes and tensor types");
  auto path = std::make_shared<std::string>();
  cmd->add_option("model", *path, "GGUF model file")->required();
  cmd->callback([path] { print_info(*path); });
}

void register_run(CLI::App& app) {
  (void)app;
}

}  // namespace kvserve::cli

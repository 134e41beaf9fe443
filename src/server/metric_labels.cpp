#include "server/metric_labels.h"

#include <map>
#include <set>
#include <sstream>

namespace kvserve::server {
namespace {

struct Family {
  std::string help_and_type;  // its # HELP and # TYPE lines, from the first source that had them
  std::string samples;
};

// The family a "# HELP name ..." or "# TYPE name ..." line is about.
std::string comment_family(const std::string& line) {
  const size_t start = 7;  // after "# HELP " / "# TYPE "
  return line.substr(start, line.find(' ', start) - start);
}

std::string with_label(const std::string& sample, const std::string& label) {
  const size_t brace = sample.find('{');
  const size_t space = sample.find(' ');
  if (brace != std::string::npos && brace < space) return sample.substr(0, brace + 1) + label + "," + sample.substr(brace + 1);
  if (space == std::string::npos) return sample;
  return sample.substr(0, space) + "{" + label + "}" + sample.substr(space);
}

}  // namespace

std::string prometheus_label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string merge_labelled(const std::vector<std::pair<std::string, std::string>>& sources,
                           const std::string& label_name) {
  std::vector<std::string> order;
  std::map<std::string, Family> families;
  for (const auto& [value, text] : sources) {
    const std::string label = label_name + "=\"" + prometheus_label_value(value) + "\"";
    std::istringstream lines(text);
    std::string line;
    std::string family;  // of the latest # TYPE: a histogram's _bucket / _sum / _count samples belong to it
    std::set<std::string> introduced;  // the families this source is the first to have: their header comes from it
    while (std::getline(lines, line)) {
      if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
        family = comment_family(line);
        if (families.try_emplace(family).second) {
          order.push_back(family);
          introduced.insert(family);
        }
        if (introduced.contains(family)) families[family].help_and_type += line + "\n";
        continue;
      }
      if (line.empty() || line[0] == '#' || family.empty()) continue;
      families[family].samples += with_label(line, label) + "\n";
    }
  }
  std::string out;
  for (const std::string& name : order) out += families[name].help_and_type + families[name].samples;
  return out;
}

}  // namespace kvserve::server

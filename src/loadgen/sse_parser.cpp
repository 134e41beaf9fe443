#include "loadgen/sse_parser.h"

namespace kvserve::loadgen {

void SseParser::feed(std::string_view bytes, const DataHandler& on_data) {
  for (char c : bytes) {
    if (c != '\n') {
      line_ += c;
      continue;
    }
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    take_line(line_, on_data);
    line_.clear();
  }
}

void SseParser::take_line(std::string_view line, const DataHandler& on_data) {
  if (line.empty()) {  // a blank line ends the event
    if (has_data_) on_data(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // a comment
  const size_t colon = line.find(':');
  if (line.substr(0, colon) != "data") return;  // event, id, retry: not used here
  std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (has_data_) data_ += '\n';
  data_ += value;
  has_data_ = true;
}

}  // namespace kvserve::loadgen

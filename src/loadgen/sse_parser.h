#pragma once
// An incremental parser of a text/event-stream (Server-Sent Events) body:
// bytes go in as they arrive from the network, in pieces of any size; each
// complete event's data (its `data:` lines joined by '\n') comes out.
// Comments (`: keep-alive`), `event:`, `id:` and `retry:` lines are skipped.
#include <functional>
#include <string>
#include <string_view>

namespace kvserve::loadgen {

class SseParser {
 public:
  using DataHandler = std::function<void(const std::string& data)>;

  // Consumes `bytes`; calls on_data once per event completed by them.
  void feed(std::string_view bytes, const DataHandler& on_data);
  // Bytes of an unfinished line or event are held (the stream was cut mid-event).
  bool has_partial_event() const { return !line_.empty() || has_data_; }

 private:
  void take_line(std::string_view line, const DataHandler& on_data);

  std::string line_;  // the current line so far
  std::string data_;  // the current event's data so far
  bool has_data_ = false;
};

}  // namespace kvserve::loadgen

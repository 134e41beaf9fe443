#pragma once
// Holds back generated text that might be the start of a stop string, and
// cuts the text at the first complete stop string.
#include <string>
#include <vector>

namespace kvserve {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Adds newly decoded text; returns the text that is now safe to emit.
  // After a stop string is found, stopped() is true and the returned text
  // ends just before it; later calls return "".
  std::string push(const std::string& text);
  // The held-back text, released when generation ends for another reason.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace kvserve

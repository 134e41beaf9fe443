#pragma once
// The Responses API's `store`: finished responses kept in memory so that a
// later request can continue one (previous_response_id) or read it back
// (GET /v1/responses/{id}). Bounded in count and bytes; past either bound the
// oldest responses are forgotten first, and a request that names one gets a
// 400 saying it is not stored.
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace kvserve::server {

class ResponseStore {
 public:
  struct Entry {
    nlohmann::json response;      // the response object as returned
    nlohmann::json conversation;  // its chat messages: history, input, the answer (no instructions)
  };

  ResponseStore(size_t max_responses, size_t max_bytes) : max_responses_(max_responses), max_bytes_(max_bytes) {}

  // An entry larger than max_bytes alone is not kept.
  void put(const std::string& id, Entry entry);
  std::optional<Entry> get(const std::string& id) const;
  bool erase(const std::string& id);
  size_t size() const;
  size_t bytes() const;

 private:
  struct Slot {
    Entry entry;
    size_t bytes = 0;
    std::list<std::string>::iterator age;
  };
  void evict_locked();

  size_t max_responses_;
  size_t max_bytes_;
  mutable std::mutex mutex_;
  std::list<std::string> oldest_first_;
  std::unordered_map<std::string, Slot> slots_;
  size_t bytes_ = 0;
};

}  // namespace kvserve::server

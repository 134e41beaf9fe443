#include "server/response_store.h"

#include "server/api_error.h"

namespace kvserve::server {

void ResponseStore::put(const std::string& id, Entry entry) {
  const size_t bytes = dump_json(entry.response).size() + dump_json(entry.conversation).size() + id.size();
  if (bytes > max_bytes_ || max_responses_ == 0) return;
  std::lock_guard lock(mutex_);
  if (auto it = slots_.find(id); it != slots_.end()) {
    bytes_ -= it->second.bytes;
    oldest_first_.erase(it->second.age);
    slots_.erase(it);
  }
  oldest_first_.push_back(id);
  slots_[id] = Slot{std::move(entry), bytes, std::prev(oldest_first_.end())};
  bytes_ += bytes;
  evict_locked();
}

void ResponseStore::evict_locked() {
  while (!oldest_first_.empty() && (slots_.size() > max_responses_ || bytes_ > max_bytes_)) {
    auto it = slots_.find(oldest_first_.front());
    bytes_ -= it->second.bytes;
    slots_.erase(it);
    oldest_first_.pop_front();
  }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) const {
  std::lock_guard lock(mutex_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return std::nullopt;
  return it->second.entry;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return false;
  bytes_ -= it->second.bytes;
  oldest_first_.erase(it->second.age);
  slots_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return slots_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace kvserve::server

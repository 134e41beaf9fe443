#include "server/json_key_order.h"

#include <algorithm>

namespace kvserve::server {

KeyOrderCapture::KeyOrderCapture(std::vector<KeyPath> paths, int64_t max_key_comparisons)
    : paths_(std::move(paths)), max_comparisons_(max_key_comparisons) {
  for (const KeyPath& p : paths_) longest_path_ = std::max(longest_path_, p.size());
}

KeyOrderCapture::~KeyOrderCapture() = default;

// Whether a value starting now sits at one of the paths: every open
// container an object, their current keys the path.
bool KeyOrderCapture::at_wanted_path() const {
  if (frames_.size() > longest_path_) return false;
  for (const Frame& f : frames_)
    if (!f.object) return false;
  return std::any_of(paths_.begin(), paths_.end(), [&](const KeyPath& p) {
    return p.size() == frames_.size() &&
           std::equal(p.begin(), p.end(), frames_.begin(), [](const std::string& k, const Frame& f) { return k == f.key; });
  });
}

void KeyOrderCapture::start(bool object) {
  if (!copying() && object && at_wanted_path()) {
    copy_ = ordered_json();
    builder_ = std::make_unique<Builder>(copy_, true);
    copy_path_.clear();
    for (const Frame& f : frames_) copy_path_.push_back(f.key);
    comparisons_ = 0;
  }
  frames_.push_back({object, {}, 0});
  if (builder_) {
    ++depth_;
    if (object) builder_->start_object(static_cast<size_t>(-1));
    else builder_->start_array(static_cast<size_t>(-1));
  }
}

void KeyOrderCapture::end(bool object) {
  frames_.pop_back();  // the parser never ends more than it started
  if (!builder_) return;
  if (object) builder_->end_object();
  else builder_->end_array();
  if (--depth_ > 0) return;
  copies_[copy_path_] = std::move(copy_);
  builder_.reset();
}

void KeyOrderCapture::key(std::string& k) {
  Frame& f = frames_.back();
  if (frames_.size() <= longest_path_) f.key = k;
  if (!builder_) return;
  comparisons_ += f.keys++;  // the keys this one is compared with
  if (comparisons_ > max_comparisons_) return drop_copy();
  builder_->key(k);
}

// Too wide to copy in order: no copy of this path (not even an earlier
// value's, which the tree no longer holds).
void KeyOrderCapture::drop_copy() {
  copies_.erase(copy_path_);
  builder_.reset();
  copy_ = ordered_json();
  depth_ = 0;
}

}  // namespace kvserve::server

#pragma once
// The objects at given key paths of a JSON text, copied in their written key
// order while BoundedTreeBuilder parses the text into nlohmann::json (whose
// objects sort their keys): a JSON schema's property order is the order its
// output is generated in (pydantic's field order), and one parse then gives
// both the tree the server reads and the schema as the client wrote it.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvserve::server {

// Object keys from the root ({} is the root itself); arrays are not stepped into.
using KeyPath = std::vector<std::string>;

class KeyOrderCapture {
 public:
  using ordered_json = nlohmann::ordered_json;
  using Copies = std::map<KeyPath, ordered_json>;

  // max_key_comparisons bounds the copies' parse, which is quadratic in an
  // object's keys (ordered_json finds a duplicate key by walking the keys):
  // past it the copy is dropped and the sorted tree is all there is.
  KeyOrderCapture(std::vector<KeyPath> paths, int64_t max_key_comparisons);
  ~KeyOrderCapture();
  KeyOrderCapture(const KeyOrderCapture&) = delete;
  KeyOrderCapture& operator=(const KeyOrderCapture&) = delete;

  // The last object found at each path (the one nlohmann::json keeps for a
  // duplicate key), in its written order.
  Copies take_copies() { return std::move(copies_); }
  bool copying() const { return builder_ != nullptr; }

  // BoundedTreeBuilder's SAX events, after its own checks.
  void start(bool object);
  void end(bool object);
  void key(std::string& k);
  template <class Event>
  void value(Event event) {
    if (copying()) event(*builder_);
  }

 private:
  struct Frame {
    bool object = false;
    std::string key;   // the current member's key (kept only where a path may still match)
    int64_t keys = 0;  // keys so far, inside a copy
  };
  using Builder = nlohmann::detail::json_sax_dom_parser<ordered_json>;

  bool at_wanted_path() const;
  void drop_copy();

  std::vector<KeyPath> paths_;
  size_t longest_path_ = 0;
  int64_t max_comparisons_;
  std::vector<Frame> frames_;  // the open arrays and objects
  // The copy being made: its tree, builder, open containers (0: none) and comparisons.
  ordered_json copy_;
  std::unique_ptr<Builder> builder_;
  KeyPath copy_path_;
  int64_t depth_ = 0;
  int64_t comparisons_ = 0;
  Copies copies_;
};

}  // namespace kvserve::server

#pragma once
// JSON from clients and models, shared by the server's parsers: optional
// fields of request bodies, and a parse with bounded nesting and a bounded
// tree. Values are copied, compared, checked and printed recursively, so no
// JSON text from outside may nest without bound (a schema sent as a string,
// tool-call arguments, model output parsed for calls); and a tree costs up to
// ~20x the bytes of its text (`[[],[],...]`: 3 bytes per empty array, 64
// bytes per node), so the parse counts what it builds and stops at a budget.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/json_key_order.h"

namespace kvserve::server {

// Request bodies and the JSON texts inside them nest at most this deep
// (OpenAI's nest about 5).
inline constexpr int kMaxJsonDepth = 64;
// Values (scalars, arrays and objects; keys not counted) in one parse: a
// prompt of a million token ids fits.
inline constexpr int64_t kMaxJsonValues = int64_t{1} << 20;
// The tree's memory as estimated while parsing (BoundedTreeBuilder): twice the
// largest body the server reads, whatever the body holds.
inline constexpr int64_t kMaxJsonTreeBytes = int64_t{32} << 20;
// ordered_json finds a duplicate key by walking the object's keys, so an
// object of n keys costs n^2/2 string comparisons (40,000 keys: 3.4 s);
// 2^25 comparisons are ~0.1 s (an object of 8,192 keys).
inline constexpr int64_t kMaxOrderedKeyComparisons = int64_t{1} << 25;

// A JSON text past one of the limits above; the message names it.
class JsonLimitError : public Error {
 public:
  using Error::Error;
};

// The field, or nullptr when it is absent or null (null means "default" in
// OpenAI's API). Safe on any JSON value: a non-object has no fields.
inline const nlohmann::json* field(const nlohmann::json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// nlohmann's SAX events, charged the memory their nodes take (64-bit
// libstdc++ and glibc malloc, rounded up) and passed on to nlohmann's own
// tree builder; throws JsonLimitError past a limit, so that a hostile text
// is refused after building at most kMaxJsonTreeBytes, not all of it.
// (Not Json::parse with a callback: its builder scans the parent's elements
// after every object, quadratic in an array of objects: `[{},{},...]` of
// 16 MiB ran for minutes.) Measured: docs/reliability.md, "Limits elsewhere".
// With a KeyOrderCapture (nlohmann::json only), the objects at its paths are
// also copied in written order, each node then charged twice.
template <class Json>
class BoundedTreeBuilder {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  explicit BoundedTreeBuilder(Json& root, KeyOrderCapture* capture = nullptr) : tree_(root, true), capture_(capture) {}

  bool null() { return add_value(0) && copy([](auto& t) { t.null(); }) && tree_.null(); }
  bool boolean(bool v) { return add_value(0) && copy([&](auto& t) { t.boolean(v); }) && tree_.boolean(v); }
  bool number_integer(number_integer_t v) {
    return add_value(0) && copy([&](auto& t) { t.number_integer(v); }) && tree_.number_integer(v);
  }
  bool number_unsigned(number_unsigned_t v) {
    return add_value(0) && copy([&](auto& t) { t.number_unsigned(v); }) && tree_.number_unsigned(v);
  }
  bool number_float(number_float_t v, const string_t& text) {
    return add_value(0) && copy([&](auto& t) { t.number_float(v, text); }) && tree_.number_float(v, text);
  }
  bool string(string_t& v) {
    return add_value(kStringBytes + heap_bytes(v.size())) && copy([&](auto& t) { t.string(v); }) && tree_.string(v);
  }
  bool binary(binary_t& v) { return add_value(kStringBytes + heap_bytes(v.size())) && tree_.binary(v); }
  bool start_object(std::size_t size) {
    if (capture_) capture_->start(true);
    return open(true, kObjectBytes) && tree_.start_object(size);
  }
  bool start_array(std::size_t size) {
    if (capture_) capture_->start(false);
    return open(false, kArrayBytes) && tree_.start_array(size);
  }
  bool end_object() {
    if (capture_) capture_->end(true);
    return close() && tree_.end_object();
  }
  bool end_array() {
    if (capture_) capture_->end(false);
    return close() && tree_.end_array();
  }
  bool key(string_t& k) {
    if (capture_) capture_->key(k);
    return add_key(k.size()) && tree_.key(k);
  }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& e) {
    return tree_.parse_error(position, token, e);  // throws e
  }

 private:
  static constexpr int64_t kSlotBytes = 32;    // a 16-byte value in its parent's vector, which doubles as it grows
  static constexpr int64_t kArrayBytes = 32;   // the heap-allocated std::vector
  static constexpr int64_t kObjectBytes = 64;  // the heap-allocated std::map
  static constexpr int64_t kMemberBytes = 96;  // a map node: links, key string, value
  static constexpr int64_t kStringBytes = 48;  // the heap-allocated std::string
  static constexpr bool kOrdered = !std::is_same_v<Json, nlohmann::json>;

  // Passes a scalar's event on to the capture's copy, if one is being made.
  template <class Event>
  bool copy(Event event) {
    if (capture_) capture_->value(event);
    return true;
  }

  // Heap bytes of a string beyond the inline 15 (its buffer, rounded up).
  static int64_t heap_bytes(size_t size) { return size > 15 ? static_cast<int64_t>(size) + 32 : 0; }

  // Depth counts the arrays and objects open around an event, as Json::parse's callback did.
  void check_depth() const {
    if (static_cast<int64_t>(open_objects_.size()) > kMaxJsonDepth)
      throw JsonLimitError("nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  bool open(bool object, int64_t bytes) {
    add_value(bytes);
    open_objects_.push_back(object ? 0 : -1);  // an object's key count; -1 for an array
    return true;
  }
  bool close() {
    open_objects_.pop_back();  // the parser never ends more than it started
    return true;
  }
  bool add_value(int64_t bytes) {
    check_depth();
    if (++values_ > kMaxJsonValues) throw JsonLimitError("holds more than " + std::to_string(kMaxJsonValues) + " values");
    return add_bytes(kSlotBytes + bytes);
  }
  bool add_key(size_t size) {
    check_depth();
    add_bytes(kMemberBytes + heap_bytes(size));
    if (!kOrdered) return true;
    comparisons_ += open_objects_.back()++;  // the keys this one is compared with
    if (comparisons_ > kMaxOrderedKeyComparisons)
      throw JsonLimitError("has objects with too many keys (keeping their order compares each key with the others)");
    return true;
  }
  bool add_bytes(int64_t bytes) {
    tree_bytes_ += capture_ && capture_->copying() ? 2 * bytes : bytes;
    if (tree_bytes_ > kMaxJsonTreeBytes)
      throw JsonLimitError("would take more than " + std::to_string(kMaxJsonTreeBytes >> 20) +
                           " MiB as a JSON tree (too many values for its size)");
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<Json> tree_;
  KeyOrderCapture* capture_;
  int64_t values_ = 0;
  int64_t tree_bytes_ = 0;
  int64_t comparisons_ = 0;
  std::vector<int64_t> open_objects_;  // one entry per open array or object, at most kMaxJsonDepth + 1
};

// `text` parsed within the limits above. Throws JsonLimitError past one (the
// message completes "the JSON text ...") and nlohmann::json::exception for
// text that is not JSON (or a number out of range, such as 1e400).
// Json: nlohmann::json or nlohmann::ordered_json.
template <class Json>
Json parse_limited_json(std::string_view text) {
  Json value;
  BoundedTreeBuilder<Json> builder(value);
  Json::sax_parse(text, &builder);
  return value;
}

// parse_limited_json<nlohmann::json>, and the objects at `keep_order_at` in
// their written order (KeyOrderCapture; within kMaxOrderedKeyComparisons).
struct JsonKeepingOrder {
  nlohmann::json tree;
  KeyOrderCapture::Copies ordered;
};
inline JsonKeepingOrder parse_limited_json_keeping_order(std::string_view text, std::vector<KeyPath> keep_order_at) {
  JsonKeepingOrder out;
  KeyOrderCapture capture(std::move(keep_order_at), kMaxOrderedKeyComparisons);
  BoundedTreeBuilder<nlohmann::json> builder(out.tree, &capture);
  nlohmann::json::sax_parse(text, &builder);
  out.ordered = capture.take_copies();
  return out;
}

// `text` parsed, or nullopt when it is not JSON or is past a limit above.
template <class Json>
std::optional<Json> parse_bounded_json(std::string_view text) {
  try {
    return parse_limited_json<Json>(text);
  } catch (const JsonLimitError&) {
    return std::nullopt;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace kvserve::server

#pragma once
// The server's API keys: where they come from (flags, files, the
// environment) and a check of a presented key that takes the same time
// whichever key it matches, if any, and whatever their lengths.
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace kvserve::server {

// Keys are 1 to this many visible ASCII characters (0x21-0x7E: what an HTTP
// header carries unchanged).
inline constexpr size_t kMaxApiKeyBytes = 256;

// The keys of `serve`: every --api-key, every line of every --api-key-file
// (blank lines and lines starting with '#' skipped, surrounding whitespace
// trimmed) and the comma-separated KVSERVE_API_KEY (env_value; nullptr or
// empty when unset). Throws kvserve::Error naming the source (never the
// key) for an unreadable file, a file or variable without a key, or a key
// that is not 1-256 visible ASCII characters.
std::vector<std::string> collect_api_keys(const std::vector<std::string>& flag_keys,
                                          const std::vector<std::string>& key_files, const char* env_value);

class ApiKeys {
 public:
  // Throws kvserve::Error for a key that is not 1-256 visible ASCII characters.
  explicit ApiKeys(const std::vector<std::string>& keys);

  bool empty() const { return keys_.empty(); }
  // Whether `presented` is one of the keys. Compares it with every key over
  // kMaxApiKeyBytes bytes, without an early exit, so the time depends only
  // on the number of keys.
  bool accepts(std::string_view presented) const;
  // Whether a request's headers carry one of the keys: "Authorization:
  // Bearer <key>" (OpenAI's clients; the scheme in any case) or "x-api-key:
  // <key>" (Anthropic's). Both are checked, whichever matches.
  bool accepts_headers(std::string_view authorization, std::string_view x_api_key) const;

 private:
  struct PaddedKey {
    std::array<unsigned char, kMaxApiKeyBytes> bytes{};  // zero past the key
    size_t size = 0;
  };
  std::vector<PaddedKey> keys_;
};

}  // namespace kvserve::server

#include "server/api_keys.h"

#include <algorithm>
#include <fstream>

#include "core/error.h"

namespace kvserve::server {
namespace {

std::string_view trimmed(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

// Throws for a key a header cannot carry as is; the message names where it came from, never the key.
void check_key(std::string_view key, const std::string& source) {
  if (key.empty() || key.size() > kMaxApiKeyBytes)
    throw Error(source + ": an API key must have 1 to " + std::to_string(kMaxApiKeyBytes) + " characters, this one has " +
                std::to_string(key.size()));
  for (char c : key)
    if (c < 0x21 || c > 0x7E)
      throw Error(source + ": an API key may hold only visible ASCII characters (no spaces or control characters)");
}

void add_file_keys(const std::string& path, std::vector<std::string>& keys) {
  std::ifstream in(path);
  if (!in) throw Error("--api-key-file " + path + ": cannot open it");
  const size_t before = keys.size();
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string_view key = trimmed(line);
    if (key.empty() || key.front() == '#') continue;
    check_key(key, "--api-key-file " + path + " line " + std::to_string(number));
    keys.emplace_back(key);
  }
  if (in.bad()) throw Error("--api-key-file " + path + ": cannot read it");
  if (keys.size() == before) throw Error("--api-key-file " + path + ": holds no key (one key per line)");
}

void add_env_keys(std::string_view value, std::vector<std::string>& keys) {
  const size_t before = keys.size();
  while (!value.empty()) {
    const size_t comma = value.find(',');
    const std::string_view key = trimmed(value.substr(0, comma));
    if (!key.empty()) {
      check_key(key, "KVSERVE_API_KEY");
      keys.emplace_back(key);
    }
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
  }
  if (keys.size() == before) throw Error("KVSERVE_API_KEY is set but holds no key (keys separated by commas)");
}

// The token of "Bearer <token>" (the scheme in any case), "" for another scheme.
std::string_view bearer_token(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() || (authorization[kScheme.size()] != ' ' && authorization[kScheme.size()] != '\t'))
    return {};
  for (size_t i = 0; i < kScheme.size(); ++i)
    if ((authorization[i] | 0x20) != kScheme[i]) return {};
  return trimmed(authorization.substr(kScheme.size()));
}

}  // namespace

std::vector<std::string> collect_api_keys(const std::vector<std::string>& flag_keys,
                                          const std::vector<std::string>& key_files, const char* env_value) {
  std::vector<std::string> keys;
  for (const std::string& key : flag_keys) {
    check_key(key, "--api-key");
    keys.push_back(key);
  }
  for (const std::string& path : key_files) add_file_keys(path, keys);
  if (env_value && *env_value) add_env_keys(env_value, keys);
  return keys;
}

ApiKeys::ApiKeys(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    check_key(key, "API key");
    PaddedKey& padded = keys_.emplace_back();
    std::copy(key.begin(), key.end(), padded.bytes.begin());
    padded.size = key.size();
  }
}

bool ApiKeys::accepts(std::string_view presented) const {
  // The length of what a client sends is no secret: refusing an overlong one at once leaks nothing.
  if (presented.empty() || presented.size() > kMaxApiKeyBytes) return false;
  std::array<unsigned char, kMaxApiKeyBytes> candidate{};
  std::copy(presented.begin(), presented.end(), candidate.begin());
  unsigned matched = 0;
  for (const PaddedKey& key : keys_) {
    // Every byte of every key, whatever the lengths (both padded with zeros to kMaxApiKeyBytes).
    unsigned diff = static_cast<unsigned>(key.size ^ presented.size());
    for (size_t i = 0; i < kMaxApiKeyBytes; ++i) diff |= key.bytes[i] ^ candidate[i];
    matched |= static_cast<unsigned>(diff == 0);
  }
  return matched != 0;
}

bool ApiKeys::accepts_headers(std::string_view authorization, std::string_view x_api_key) const {
  const bool bearer = accepts(bearer_token(authorization));
  const bool header = accepts(trimmed(x_api_key));
  return bearer || header;
}

}  // namespace kvserve::server

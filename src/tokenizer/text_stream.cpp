#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kvserve {

namespace {

// Moves the complete characters at the front of `pending` to the result.
// Bytes that cannot become a character are replaced by U+FFFD (one per
// maximal subpart); a character cut short at the end is kept back unless
// `final`.
std::string take_complete_text(std::string& pending, bool final) {
  std::string text;
  size_t pos = 0;
  while (pos < pending.size()) {
    const size_t valid = utf8_valid_prefix_length(pending, pos);
    const size_t wanted = utf8_lead_length(static_cast<uint8_t>(pending[pos]));
    if (valid != 0 && valid == wanted) {
      text.append(pending, pos, valid);
      pos += valid;
      continue;
    }
    const bool cut_short = valid != 0 && pos + valid == pending.size();
    if (cut_short && !final) break;
    append_utf8(text, kReplacementChar);
    pos += valid == 0 ? 1 : valid;
  }
  pending.erase(0, pos);
  return text;
}

}  // namespace

std::string TokenTextStream::push(int32_t id) {
  std::string bytes = tok_->token_bytes(id);
  if (count_ == 0) first_id_ = id;
  if (tok_->strips_leading_space(count_, first_id_) && bytes.starts_with(' ')) bytes.erase(0, 1);
  ++count_;
  pending_ += bytes;
  return take_complete_text(pending_, false);
}

std::string TokenTextStream::flush() { return take_complete_text(pending_, true); }

}  // namespace kvserve

// libFuzzer target: tokenizer encode / decode round trip. The first byte
// picks the vocabulary (byte-level BPE or SentencePiece), the rest is text.
// Valid UTF-8 must come back unchanged from decode(encode(text)), the
// streamed text must equal a valid decode(), and any bytes must encode and
// decode without throwing.
#include <cstdlib>
#include <string>

#include "tests/tiny_vocab.h"
#include "tokenizer/unicode.h"

using namespace kvserve;

namespace {

bool valid_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = utf8_sequence_length(text, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

void round_trip(const Tokenizer& tok, const std::string& text) {
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  const std::string decoded = tok.decode(ids);
  TokenTextStream stream(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.flush();
  // SentencePiece spells spaces U+2581 and decodes that back to a space, as
  // sentencepiece itself does: text holding U+2581 cannot round-trip.
  const bool lossless = tok.kind() == VocabKind::kBytePairGpt2 || text.find("\xE2\x96\x81") == std::string::npos;
  if (valid_utf8(text) && lossless && decoded != text) std::abort();
  if (valid_utf8(decoded) && streamed != decoded) std::abort();
  tok.decode(tok.encode(text, true, true));  // special tokens parsed: must not throw
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer bpe = test_util::tiny_bpe_tokenizer();
  static const Tokenizer spm = test_util::tiny_spm_tokenizer();
  if (size == 0) return 0;
  round_trip(data[0] % 2 == 0 ? bpe : spm, std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  return 0;
}

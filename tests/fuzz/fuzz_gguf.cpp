// libFuzzer target: arbitrary bytes as a model file, through everything that
// reads one at start-up (GGUF reader, ModelConfig, tokenizer, chat template,
// Model::load). Only kvserve::Error may come out; anything else aborts.
#include "core/error.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/model.h"
#include "tests/tiny_vocab.h"
#include "tokenizer/chat_template.h"

using namespace kvserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const test_util::MemoryFile file(data, size);
    const GGUFFile gguf(file.path());
    try {
      ModelConfig::from_gguf(gguf);
    } catch (const Error&) {
    }
    try {
      Tokenizer::from_gguf(gguf).encode("Hello <|im_end|> w\xC3\xA9rld", true);
    } catch (const Error&) {
    }
    ChatTemplate::for_model(gguf);  // falls back to ChatML instead of throwing
    ModelLoadOptions options;
    options.repack = false;  // the repack kernels are not input parsing
    Model::load(file.path(), options);
  } catch (const Error&) {
  }
  return 0;
}

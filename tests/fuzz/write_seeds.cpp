// Writes the generated seeds of the fuzz corpora (tests/fuzz/corpus/): the
// tiny model of tests/tiny_vocab.h as a GGUF file. Run once after changing it:
//   build-fuzz/fuzz_write_seeds tests/fuzz/corpus
#include <cstdio>
#include <string>

#include "tests/tiny_vocab.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  kvserve::test_util::tiny_model_writer().write(std::string(argv[1]) + "/gguf/tiny_model.gguf");
  return 0;
}

#include <gtest/gtest.h>

#include "model/gguf.h"
#include "model/gguf_writer.h"

TEST(GGUF, placeholder) { SUCCEED(); }

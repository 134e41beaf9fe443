#pragma once
// Rewrites a GGUF model with its weight matrices in another storage type
// (`kvserve quantize`): metadata copied as is, 1-D tensors (norms, biases)
// kept in f32, every 2-D matrix whose rows are whole blocks of the target
// type re-encoded from its dequantized values.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kvserve {

struct QuantizeReport {
  int converted = 0;                  // matrices written in the target type
  std::vector<std::string> kept;      // matrices left as they were (rows not whole blocks)
  size_t bytes_in = 0, bytes_out = 0; // tensor data sizes
};

// What to write: one type for every matrix, or a llama.cpp-style K-quant mix.
struct QuantizeRecipe {
  std::string name;      // as given: "q8_0", "q4_k_m", ...
  DType base = DType::Q8_0;
  // The K mixes: Q6_K for output.weight (token_embd.weight when tied) and
  // for attn_v / ffn_down of the layers that get more bits (llama.cpp's
  // use_more_bits: the first and last eighth, and every third between).
  bool mixed = false;
  uint32_t file_type = 7;  // general.file_type, llama.cpp's numbering
};

// f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q4_k, q5_k, q6_k, q4_k_m, q5_k_m; throws
// kvserve::Error listing them.
QuantizeRecipe parse_quantize_recipe(const std::string& name);

// Throws kvserve::Error for an unreadable input or a write failure. K-quant
// matrices whose rows are not whole 256-value blocks fall back as llama.cpp
// does (Q4_K and Q5_K to Q5_0, Q6_K to Q8_0), and are searched for the least
// squared error per sub-block.
QuantizeReport quantize_model(const std::string& input, const std::string& output, const QuantizeRecipe& recipe);
// One type for every matrix (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs; the K types too).
QuantizeReport quantize_model(const std::string& input, const std::string& output, DType target);

}  // namespace kvserve

#include "model/quantize_model.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/quantize.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace kvserve {
namespace {

constexpr const char* kRecipes = "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q4_k, q5_k, q6_k, q4_k_m, q5_k_m";

// llama.cpp's general.file_type values (LLAMA_FTYPE_*) of the whole-model types we write.
uint32_t file_type_of(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q4_1: return 3;
    case DType::Q8_0: return 7;
    case DType::Q5_0: return 8;
    case DType::Q5_1: return 9;
    case DType::IQ4_NL: return 25;
    case DType::IQ4_XS: return 30;
    case DType::Q4_K: return 14;  // Q4_K_S
    case DType::Q5_K: return 16;  // Q5_K_S
    case DType::Q6_K: return 18;
    case DType::BF16: return 32;
    default: throw Error(std::string("quantize: cannot write whole models as ") + dtype_name(t) + " (supported: " +
                         kRecipes + ")");
  }
}

// Types of 256-value super-blocks.
bool is_k_quant(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::IQ4_XS; }

// The layer index of "blk.N.<name>", or -1.
int layer_of(const std::string& tensor) {
  if (tensor.rfind("blk.", 0) != 0) return -1;
  const size_t dot = tensor.find('.', 4);
  if (dot == std::string::npos) return -1;
  try {
    return std::stoi(tensor.substr(4, dot - 4));
  } catch (const std::exception&) {
    return -1;
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers, and every third in between.
bool gets_more_bits(int layer, int n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

// The type a matrix is written in under the recipe (before the row-size fallback).
DType type_for(const QuantizeRecipe& r, const std::string& name, int n_layers, bool tied_embeddings) {
  if (!r.mixed) return r.base;
  if (name == "output.weight" || (tied_embeddings && name == "token_embd.weight")) return DType::Q6_K;
  const int layer = layer_of(name);
  // ffn_down of a mixture of experts too: its experts' (ffn_down_exps) and shared expert's (llama.cpp matches "ffn_down").
  const bool down = ends_with(name, "ffn_down.weight") || ends_with(name, "ffn_down_exps.weight") ||
                    ends_with(name, "ffn_down_shexp.weight");
  if (layer >= 0 && (ends_with(name, "attn_v.weight") || down) && gets_more_bits(layer, n_layers))
    return DType::Q6_K;
  return r.base;
}

// K-quant rows must be whole 256-value blocks; others take llama.cpp's fallback.
DType fitting_type(DType t, int64_t cols) {
  if (!is_k_quant(t) || cols % dtype_info(t).block_size == 0) return t;
  if (t == DType::IQ4_XS) return DType::IQ4_NL;
  return t == DType::Q6_K ? DType::Q8_0 : DType::Q5_0;
}

int layer_count(const GGUFFile& in) {
  int n = 0;
  for (const TensorView& t : in.tensors()) n = std::max(n, layer_of(t.name) + 1);
  return n;
}

std::vector<uint8_t> requantize(const TensorView& t, DType target) {
  const int64_t cols = t.cols(), rows = t.rows();
  const size_t out_row = dtype_row_bytes(target, cols);
  std::vector<uint8_t> out(out_row * static_cast<size_t>(rows));
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t.type, t.row(r), row.data(), cols);
      quantize_row_searched(target, row.data(), out.data() + static_cast<size_t>(r) * out_row, cols);
    }
  }
  return out;
}

}  // namespace

QuantizeRecipe parse_quantize_recipe(const std::string& name) {
  if (name == "q4_k_m") return {name, DType::Q4_K, true, 15};
  if (name == "q5_k_m") return {name, DType::Q5_K, true, 17};
  DType t;
  try {
    t = parse_dtype(name);
  } catch (const Error&) {
    throw Error("quantize: unknown type '" + name + "' (supported: " + kRecipes + ")");
  }
  return {name, t, false, file_type_of(t)};
}

QuantizeReport quantize_model(const std::string& input, const std::string& output, DType target) {
  return quantize_model(input, output, QuantizeRecipe{dtype_name(target), target, false, file_type_of(target)});
}

QuantizeReport quantize_model(const std::string& input, const std::string& output, const QuantizeRecipe& recipe) {
  const uint32_t file_type = recipe.file_type;
  GGUFFile in(input);
  const int n_layers = layer_count(in);
  bool tied = true;
  for (const TensorView& t : in.tensors()) tied = tied && t.name != "output.weight";
  GGUFWriter w;
  for (const auto& [key, value] : in.metadata()) {
    if (key == "general.file_type" || key == "general.alignment") continue;
    w.set_value(key, value);
  }
  w.set_u32("general.file_type", file_type);
  QuantizeReport report;
  for (const TensorView& t : in.tensors()) {
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    // Matrices, and a mixture of experts' stacked ones (ne = {cols, rows, experts}: rows of the same width).
    // Never the router (ffn_gate_inp): llama.cpp keeps it f32, as routing decides which weights run at all.
    const bool router = ends_with(t.name, "ffn_gate_inp.weight");
    const bool stacked = t.n_dims == 2 || t.n_dims == 3;
    const DType target = stacked ? fitting_type(type_for(recipe, t.name, n_layers, tied), t.cols()) : recipe.base;
    report.bytes_in += t.nbytes;
    const bool matrix = stacked && !router && t.cols() % dtype_info(target).block_size == 0 && dtype_info(t.type).supported;
    if (!matrix || t.type == target) {
      if (t.type != target && t.n_dims > 1) report.kept.push_back(t.name);
      w.add_tensor(t.name, t.type, ne, t.data, t.nbytes);
      report.bytes_out += t.nbytes;
      continue;
    }
    const std::vector<uint8_t> bytes = requantize(t, target);
    w.add_tensor(t.name, target, ne, bytes.data(), bytes.size());
    report.bytes_out += bytes.size();
    report.converted++;
  }
  w.write(output);
  return report;
}

}  // namespace kvserve

#include "model/quantize_model.h"

#include <vector>

#include "core/error.h"
#include "kernels/quantize.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace kvserve {
namespace {

// llama.cpp's general.file_type values for the whole-model types we write.
uint32_t file_type_of(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q4_1: return 3;
    case DType::Q8_0: return 7;
    case DType::BF16: return 32;
    default: throw Error(std::string("quantize: cannot write whole models as ") + dtype_name(t) +
                         " (supported: f32, f16, bf16, q8_0, q4_0, q4_1)");
  }
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
      quantize_row(target, row.data(), out.data() + static_cast<size_t>(r) * out_row, cols);
    }
  }
  return out;
}

}  // namespace

QuantizeReport quantize_model(const std::string& input, const std::string& output, DType target) {
  const uint32_t file_type = file_type_of(target);
  GGUFFile in(input);
  GGUFWriter w;
  for (const auto& [key, value] : in.metadata()) {
    if (key == "general.file_type" || key == "general.alignment") continue;
    w.set_value(key, value);
  }
  w.set_u32("general.file_type", file_type);
  QuantizeReport report;
  for (const TensorView& t : in.tensors()) {
    std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
    report.bytes_in += t.nbytes;
    const bool matrix = t.n_dims == 2 && t.cols() % dtype_info(target).block_size == 0 && dtype_info(t.type).supported;
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

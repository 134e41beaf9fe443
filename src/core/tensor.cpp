#include "core/tensor.h"

namespace kvserve {

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < n_dims; ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "]";
}

}  // namespace kvserve

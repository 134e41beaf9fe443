#include "model/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "kernels/quantize.h"
#include "kernels/float_packed.h"
#include "kernels/repack.h"

namespace kvserve {
namespace {

class WeightLoader {
 public:
  // derived: where matrices computed at load (not views of the file) keep their bytes.
  WeightLoader(const GGUFFile& file, std::vector<AlignedBuffer<uint8_t>>& derived) : file_(file), derived_(derived) {}

  // The transpose of t ([cols rows, rows cols]) in f32 memory of its own: exact
  // (a re-quantized copy would round t's values a second time; measured against
  // llama.cpp on a q8_0 file that tripled the difference, 0.12 -> 0.31).
  TensorView transposed(const TensorView& t, const std::string& name) const {
    const int64_t rows = t.rows(), cols = t.cols();
    TensorView v;
    v.name = name;
    v.type = DType::F32;
    v.n_dims = 2;
    v.ne = {rows, cols, 1, 1};
    v.nbytes = static_cast<size_t>(rows * cols) * sizeof(float);
    AlignedBuffer<uint8_t>& bytes = derived_.emplace_back(v.nbytes);
    auto* out = reinterpret_cast<float*>(bytes.data());
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t.type, t.row(r), row.data(), cols);
      for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = row[static_cast<size_t>(c)];
    }
    v.data = bytes.data();
    return v;
  }

  // A matrix with `rows` output rows of `cols` inputs (GGUF ne = {cols, rows}).
  TensorView matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const TensorView& t = file_.tensor(name);
    if (t.n_dims != 2 || t.ne[0] != cols || t.ne[1] != rows)
      throw Error(file_.path() + ": tensor " + name + " has shape " + t.shape_string() + ", expected [" +
                  std::to_string(cols) + ", " + std::to_string(rows) + "]");
    require_computable(t, name);
    return t;
  }

  // n stacked [rows, cols] matrices (GGUF ne = {cols, rows, n}: a mixture of
  // experts' experts), as one matrix of n x rows rows (ne = {cols, n x rows}).
  TensorView stacked(const std::string& name, int64_t n, int64_t rows, int64_t cols) const {
    TensorView t = file_.tensor(name);
    if (t.n_dims != 3 || t.ne[0] != cols || t.ne[1] != rows || t.ne[2] != n)
      throw Error(file_.path() + ": tensor " + name + " has shape " + t.shape_string() + ", expected [" +
                  std::to_string(cols) + ", " + std::to_string(rows) + ", " + std::to_string(n) + "]");
    require_computable(t, name);
    t.n_dims = 2;
    t.ne = {cols, n * rows, 1, 1};
    return t;
  }

  std::vector<float> vector(const std::string& name, int64_t n) const {
    const TensorView& t = file_.tensor(name);
    if (t.numel() != n)
      throw Error(file_.path() + ": tensor " + name + " has shape " + t.shape_string() + ", expected [" +
                  std::to_string(n) + "]");
    if (!dtype_info(t.type).supported)
      throw Error(file_.path() + ": tensor " + name + " has unsupported type " + dtype_name(t.type));
    std::vector<float> v(static_cast<size_t>(n));
    dequantize_row(t.type, t.data, v.data(), n);
    return v;
  }

  bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }

  std::vector<float> optional_vector(const std::string& name, int64_t n) const {
    return file_.find_tensor(name) ? vector(name, n) : std::vector<float>{};
  }

 private:
  void require_computable(const TensorView& t, const std::string& name) const {
    if (!dtype_info(t.type).supported)
      throw Error(file_.path() + ": tensor " + name + " has type " + dtype_name(t.type) +
                  ", which kvserve cannot compute with yet (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, "
                  "q5_1, iq4_nl, iq4_xs, q2_k, q3_k, q4_k, q5_k, q6_k)");
  }

  const GGUFFile& file_;
  std::vector<AlignedBuffer<uint8_t>>& derived_;
};

// Rows [first, first + n) of a matrix: a view of the same bytes (rows are contiguous).
TensorView row_slice(const TensorView& t, int64_t first, int64_t n, const std::string& name) {
  TensorView v = t;
  v.name = name;
  v.data = t.row(first);
  v.ne[1] = n;
  v.nbytes = t.row_bytes() * static_cast<size_t>(n);
  return v;
}

void load_experts(const WeightLoader& w, const ModelConfig& c, const std::string& p, LayerWeights& l) {
  const int64_t E = c.n_experts, ff = c.expert_ffn_dim;
  l.router = w.matrix(p + "ffn_gate_inp.weight", E, c.dim);
  l.expert_bias = w.optional_vector(p + "exp_probs_b.bias", E);
  const TensorView gate = w.stacked(p + "ffn_gate_exps.weight", E, ff, c.dim);
  const TensorView up = w.stacked(p + "ffn_up_exps.weight", E, ff, c.dim);
  const TensorView down = w.stacked(p + "ffn_down_exps.weight", E, c.dim, ff);
  // One view per expert over the same mapped bytes (each expert's rows are contiguous).
  const auto expert = [](const TensorView& t, int64_t e, int64_t rows) {
    return row_slice(t, e * rows, rows, t.name + "[" + std::to_string(e) + "]");
  };
  for (int64_t e = 0; e < E; ++e) l.experts.push_back({expert(gate, e, ff), expert(up, e, ff), expert(down, e, c.dim)});
  if (c.shared_expert_ffn_dim == 0) return;
  const int64_t sff = c.shared_expert_ffn_dim;
  if (c.shared_expert_gated) l.shared_gate_inp = w.vector(p + "ffn_gate_inp_shexp.weight", c.dim);
  l.shared_gate = w.matrix(p + "ffn_gate_shexp.weight", sff, c.dim);
  l.shared_up = w.matrix(p + "ffn_up_shexp.weight", sff, c.dim);
  l.shared_down = w.matrix(p + "ffn_down_shexp.weight", c.dim, sff);
}

// MLA's attention weights (llama.cpp's deepseek2 tensors); attn_k_b / attn_v_b
// are stacked per head and become one view per head.
void load_mla(const WeightLoader& w, const ModelConfig& c, const std::string& p, LayerWeights& l) {
  const int64_t H = c.n_heads, kq = c.mla_key_dim(), rank = c.kv_lora_rank;
  if (c.q_lora_rank > 0) {
    l.wq_a = w.matrix(p + "attn_q_a.weight", c.q_lora_rank, c.dim);
    l.q_a_norm = w.vector(p + "attn_q_a_norm.weight", c.q_lora_rank);
    l.wq_b = w.matrix(p + "attn_q_b.weight", H * kq, c.q_lora_rank);
  } else {
    l.wq = w.matrix(p + "attn_q.weight", H * kq, c.dim);
  }
  l.wkv_a = w.matrix(p + "attn_kv_a_mqa.weight", rank + c.rope_dims, c.dim);
  l.kv_a_norm = w.vector(p + "attn_kv_a_norm.weight", rank);
  if (c.mla_fused_kv_b) {  // the older layout: per head, W_UK's rows (to transpose) then W_UV's
    const int64_t nope = c.qk_nope_dim, vd = c.v_head_dim;
    const TensorView kv_b = w.matrix(p + "attn_kv_b.weight", H * (nope + vd), rank);
    for (int64_t h = 0; h < H; ++h) {
      const std::string head = "[" + std::to_string(h) + "]";
      l.wk_b.push_back(w.transposed(row_slice(kv_b, h * (nope + vd), nope, ""), kv_b.name + head + "[k, transposed]"));
      l.wv_b.push_back(row_slice(kv_b, h * (nope + vd) + nope, vd, kv_b.name + head + "[v]"));
    }
  } else {
    const TensorView k_b = w.stacked(p + "attn_k_b.weight", H, rank, c.qk_nope_dim);
    const TensorView v_b = w.stacked(p + "attn_v_b.weight", H, c.v_head_dim, rank);
    for (int64_t h = 0; h < H; ++h) {
      l.wk_b.push_back(row_slice(k_b, h * rank, rank, k_b.name + "[" + std::to_string(h) + "]"));
      l.wv_b.push_back(row_slice(v_b, h * c.v_head_dim, c.v_head_dim, v_b.name + "[" + std::to_string(h) + "]"));
    }
  }
  l.wo = w.matrix(p + "attn_output.weight", c.dim, H * c.v_head_dim);
}

LayerWeights load_layer(const WeightLoader& w, const ModelConfig& c, int64_t i) {
  const std::string p = "blk." + std::to_string(i) + ".";
  LayerWeights l;
  l.attn_norm = w.vector(p + "attn_norm.weight", c.dim);
  if (c.is_mla()) {
    load_mla(w, c, p, l);
  } else if (w.has(p + "attn_qkv.weight")) {  // phi3: Q, K and V rows in one matrix
    const TensorView qkv = w.matrix(p + "attn_qkv.weight", c.q_dim() + 2 * c.kv_dim(), c.dim);
    l.wq = row_slice(qkv, 0, c.q_dim(), p + "attn_qkv.weight[q]");
    l.wk = row_slice(qkv, c.q_dim(), c.kv_dim(), p + "attn_qkv.weight[k]");
    l.wv = row_slice(qkv, c.q_dim() + c.kv_dim(), c.kv_dim(), p + "attn_qkv.weight[v]");
  } else {
    l.wq = w.matrix(p + "attn_q.weight", c.q_dim(), c.dim);
    l.wk = w.matrix(p + "attn_k.weight", c.kv_dim(), c.dim);
    l.wv = w.matrix(p + "attn_v.weight", c.kv_dim(), c.dim);
  }
  if (!c.is_mla()) l.wo = w.matrix(p + "attn_output.weight", c.dim, c.q_dim());
  l.bq = w.optional_vector(p + "attn_q.bias", c.q_dim());
  l.bk = w.optional_vector(p + "attn_k.bias", c.kv_dim());
  l.bv = w.optional_vector(p + "attn_v.bias", c.kv_dim());
  // Required where the architecture has them: a missing one must not silently skip a norm.
  if (c.arch == "qwen3" || c.arch == "qwen3moe" || c.arch == "gemma3") {
    l.q_norm = w.vector(p + "attn_q_norm.weight", c.head_dim);
    l.k_norm = w.vector(p + "attn_k_norm.weight", c.head_dim);
  }
  if (c.arch == "gemma3") {  // its converter already added Gemma's +1 to every norm weight
    l.attn_post_norm = w.vector(p + "post_attention_norm.weight", c.dim);
    l.ffn_post_norm = w.vector(p + "post_ffw_norm.weight", c.dim);
  }
  l.ffn_norm = w.vector(p + "ffn_norm.weight", c.dim);
  if (c.is_moe_block(i)) {
    load_experts(w, c, p, l);
    return l;
  }
  if (!w.has(p + "ffn_gate.weight") && w.has(p + "ffn_up.weight")) {  // phi3: gate rows, then up rows
    const TensorView gate_up = w.matrix(p + "ffn_up.weight", 2 * c.ffn_dim, c.dim);
    l.w_gate = row_slice(gate_up, 0, c.ffn_dim, p + "ffn_up.weight[gate]");
    l.w_up = row_slice(gate_up, c.ffn_dim, c.ffn_dim, p + "ffn_up.weight[up]");
  } else {
    l.w_gate = w.matrix(p + "ffn_gate.weight", c.ffn_dim, c.dim);
    l.w_up = w.matrix(p + "ffn_up.weight", c.ffn_dim, c.dim);
  }
  l.w_down = w.matrix(p + "ffn_down.weight", c.dim, c.ffn_dim);
  return l;
}

}  // namespace

namespace {
// Both constnesses of LayerWeights::matrices().
template <typename Layer>
auto matrices_of(Layer& l) {
  std::vector<decltype(&l.wq)> out;
  for (auto* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.router, &l.shared_gate, &l.shared_up,
                  &l.shared_down, &l.wq_a, &l.wq_b, &l.wkv_a})
    if (t->data != nullptr) out.push_back(t);
  for (auto& t : l.wk_b) out.push_back(&t);
  for (auto& t : l.wv_b) out.push_back(&t);
  for (auto& e : l.experts)
    for (auto* t : {&e.gate, &e.up, &e.down}) out.push_back(t);
  return out;
}
}  // namespace

std::vector<TensorView*> LayerWeights::matrices() { return matrices_of(*this); }
std::vector<const TensorView*> LayerWeights::matrices() const { return matrices_of(*this); }

namespace {
// The blocks a load keeps: the first max_layers (a draft: a whole model of
// that many), or a pipeline rank's even share of the file's.
LayerRange kept_layers(const std::string& path, int64_t file_layers, const ModelLoadOptions& o) {
  if (o.max_layers < 0 || o.max_layers > file_layers)
    throw Error(path + ": cannot keep the first " + std::to_string(o.max_layers) + " layers, the model has " +
                std::to_string(file_layers) + " (use 1.." + std::to_string(file_layers) + ", or 0 for all)");
  if (o.pipeline_ranks < 1 || o.pipeline_rank < 0 || o.pipeline_rank >= o.pipeline_ranks)
    throw Error("pipeline rank " + std::to_string(o.pipeline_rank) + " of " + std::to_string(o.pipeline_ranks) +
                " does not exist");
  if (o.pipeline_ranks > 1 && o.max_layers > 0) throw Error("a pipeline stage cannot also keep only its first layers");
  if (o.pipeline_ranks > file_layers)
    throw Error(path + ": " + std::to_string(o.pipeline_ranks) + " pipeline ranks need at least as many layers, the model has " +
                std::to_string(file_layers));
  if (o.max_layers > 0) return {0, o.max_layers, o.max_layers};
  const int64_t r = o.pipeline_rank, n = o.pipeline_ranks;
  return {r * file_layers / n, (r + 1) * file_layers / n, file_layers};
}
}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, const ModelLoadOptions& options) {
  auto m = std::unique_ptr<Model>(new Model());
  m->file_ = std::make_unique<GGUFFile>(path);
  m->config_ = ModelConfig::from_gguf(*m->file_);
  if (options.rope_scaling)
    m->config_.override_rope_scaling(options.rope_scaling->type, options.rope_scaling->factor,
                                     options.rope_scaling->original_context);
  const LayerRange range = kept_layers(path, m->config_.n_layers, options);
  m->layer_range_ = range;
  // Everything downstream (decoders, KV caches) sizes itself from n_layers.
  if (options.max_layers > 0 && options.max_layers < m->config_.n_layers)
    m->config_.name += " (first " + std::to_string(options.max_layers) + " of " +
                       std::to_string(m->config_.n_layers) + " layers)";
  if (options.pipeline_ranks > 1)
    m->config_.name += " (layers " + std::to_string(range.first) + ".." + std::to_string(range.end - 1) + " of " +
                       std::to_string(range.total) + ")";
  m->config_.n_layers = range.end - range.first;
  // Per-layer flags are indexed by the stage's own layer numbers.
  if (m->config_.sliding_window > 0)
    m->config_.layer_is_sliding = std::vector<bool>(m->config_.layer_is_sliding.begin() + range.first,
                                                    m->config_.layer_is_sliding.begin() + range.end);
  const ModelConfig& c = m->config_;
  WeightLoader w(*m->file_, m->derived_);
  ModelWeights& mw = m->weights_;
  mw.tied_output = m->file_->find_tensor("output.weight") == nullptr;
  if (m->embeds_tokens() || (m->has_output_head() && mw.tied_output))
    mw.token_embd = w.matrix("token_embd.weight", c.vocab_size, c.dim);
  if (m->has_output_head()) {
    mw.output_norm = w.vector("output_norm.weight", c.dim);
    mw.output = mw.tied_output ? mw.token_embd : w.matrix("output.weight", c.vocab_size, c.dim);
  }
  if (options.max_output_rows < 0)
    throw Error(path + ": the output head cannot keep " + std::to_string(options.max_output_rows) + " rows");
  if (options.max_output_rows > 0 && options.max_output_rows < c.vocab_size) {
    mw.output.ne = {c.dim, options.max_output_rows, 1, 1};
    mw.output.nbytes = mw.output.row_bytes() * static_cast<size_t>(options.max_output_rows);
    m->config_.name += " (logits for the first " + std::to_string(options.max_output_rows) + " tokens)";
  }
  for (int64_t i = range.first; i < range.end; ++i) mw.layers.push_back(load_layer(w, c, i));
  m->activations_ = options.activations;
  const char* repack_env = std::getenv("KVSERVE_REPACK");  // "0": keep the old kernels (A/B benchmarks)
  const bool repack = options.repack && !(repack_env != nullptr && std::string_view(repack_env) == "0");
  // Quantized matrices only for the 8-bit-activation kernels; float matrices
  // always, as their GEMM multiplies exact f32 activations in both modes.
  const bool q8 = options.activations.value_or(activation_precision()) == ActivationPrecision::kQ8;
  if (repack) m->repack_matrices(q8 && packed_kernels_active(), float_packed_kernels_active());
  return m;
}

namespace {
// Drops the mapped pages wholly inside [p, p + n) from this process (they
// come back from the page cache if read again), so that a repacked copy
// replaces its original in memory instead of sitting beside it.
void release_mapped_pages(const uint8_t* p, size_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}
}  // namespace

namespace {
// The two repacked layouts: float weights (kernels/float_packed.h) and the
// quantized ones (kernels/repack.h), both in row groups of 8.
size_t repacked_group_bytes(const TensorView& t) {
  return float_weight_type(t.type) ? float_packed_group_bytes(t.type, t.cols()) : packed_group_bytes(t.type, t.cols());
}
void repack_rows(const TensorView& t, uint8_t* dst) {
  if (float_weight_type(t.type)) repack_float_rows8(t, dst);
  else repack_rows8(t, dst);
}
}  // namespace

void Model::repack_matrices(bool quantized, bool floats) {
  std::vector<TensorView*> todo;
  for (LayerWeights& l : weights_.layers)
    for (TensorView* t : l.matrices()) todo.push_back(t);
  if (has_output_head()) todo.push_back(&weights_.output);
  std::erase_if(todo, [&](const TensorView* t) {
    const bool wanted = (quantized && packable_type(t->type)) || (floats && float_weight_type(t->type));
    return !wanted || t->packed != nullptr;
  });
  for (const TensorView* t : todo)
    packed_.emplace_back(static_cast<size_t>((t->rows() + 7) / 8) * repacked_group_bytes(*t));
  // Tensors are independent; a 1.5B model's repack is ~1 s of one core's time.
  // A tensor goes in slices whose mapped pages are dropped as soon as they are
  // packed: a big output head (Gemma 3's 262144 x 640, 171 MiB) is then never
  // resident twice, which set the process's peak RSS.
  constexpr int64_t kSliceRows = 2048;  // a multiple of the 8-row groups
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < todo.size(); ++i) {
    const TensorView& t = *todo[i];
    const size_t group_bytes = repacked_group_bytes(t);
    for (int64_t first = 0; first < t.rows(); first += kSliceRows) {
      const TensorView slice = row_slice(t, first, std::min(kSliceRows, t.rows() - first), t.name);
      repack_rows(slice, packed_[i].data() + static_cast<size_t>(first / 8) * group_bytes);
      if (file_->maps(slice.data)) release_mapped_pages(slice.data, slice.nbytes);
    }
    // The pages the slices shared (never a derived matrix's memory: dropping those pages would zero it).
    if (file_->maps(t.data)) release_mapped_pages(t.data, t.nbytes);
  }
  for (size_t i = 0; i < todo.size(); ++i) todo[i]->packed = packed_[i].data();
  const ModelWeights& w = weights_;
  release_embedding_pages_ = embeds_tokens() && has_output_head() && w.tied_output && w.output.packed != nullptr &&
                             file_->maps(w.token_embd.data);
}

void Model::release_embedding_row(int32_t id) const {
  if (!release_embedding_pages_) return;
  // A fault maps more than its page: Linux maps the page cache's neighbours (fault-around, 64 KB) or a whole
  // 2 MB folio where the file's page cache holds large folios (the mapping is 2 MB aligned for that). So the
  // aligned 2 MB around the row go, clamped to the table's own pages (inside the file's mapping, never a
  // neighbouring mapping's memory). The mapping is read-only: a dropped neighbour costs a re-map from the page
  // cache only, and doing it row by row keeps at most a window or two resident.
  constexpr uintptr_t kWindow = 2 * 1024 * 1024;
  const TensorView& emb = weights_.token_embd;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t table_begin = reinterpret_cast<uintptr_t>(emb.data) / page * page;
  const uintptr_t table_end = (reinterpret_cast<uintptr_t>(emb.data) + emb.nbytes + page - 1) / page * page;
  const auto row = reinterpret_cast<uintptr_t>(emb.row(id));
  const uintptr_t begin = std::max(row / kWindow * kWindow, table_begin);
  const uintptr_t end = std::min((row + emb.row_bytes() + kWindow - 1) / kWindow * kWindow, table_end);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

size_t Model::weight_bytes_per_token() const {
  size_t bytes = (has_output_head() ? weights_.output.nbytes : 0) + (embeds_tokens() ? weights_.token_embd.row_bytes() : 0);
  for (const LayerWeights& l : weights_.layers) {
    size_t expert_bytes = 0;
    for (const ExpertWeights& e : l.experts) expert_bytes += e.gate.nbytes + e.up.nbytes + e.down.nbytes;
    for (const TensorView* t : l.matrices()) bytes += t->nbytes;
    // A token reads its n_experts_used experts, not all of them.
    if (!l.experts.empty())
      bytes -= expert_bytes - expert_bytes * static_cast<size_t>(config_.n_experts_used) / l.experts.size();
  }
  return bytes;
}

namespace {
size_t f32_bytes(const std::vector<float>& v) { return v.size() * sizeof(float); }
// A matrix's bytes in memory: its repacked copy when it has one, else the mapped bytes.
size_t matrix_bytes(const TensorView& t) {
  if (t.packed == nullptr) return t.nbytes;
  const size_t group = float_weight_type(t.type) ? float_packed_group_bytes(t.type, t.cols()) : packed_group_bytes(t.type, t.cols());
  return static_cast<size_t>((t.rows() + 7) / 8) * group;
}
}  // namespace

size_t Model::resident_weight_bytes() const {
  const ModelWeights& w = weights_;
  size_t bytes = f32_bytes(w.output_norm);
  if (embeds_tokens()) bytes += w.token_embd.nbytes;
  // A tied head repacked is a copy beside the embedding; unpacked it is the embedding itself.
  if (has_output_head() && (!w.tied_output || w.output.packed != nullptr || !embeds_tokens()))
    bytes += matrix_bytes(w.output);
  for (const LayerWeights& l : w.layers) {
    for (const TensorView* t : l.matrices()) bytes += matrix_bytes(*t);
    for (const std::vector<float>* v : {&l.attn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm, &l.attn_post_norm,
                                        &l.ffn_norm, &l.ffn_post_norm, &l.shared_gate_inp, &l.expert_bias, &l.q_a_norm,
                                        &l.kv_a_norm})
      bytes += f32_bytes(*v);
  }
  return bytes;
}

}  // namespace kvserve

// The paged KV cache in every KV element type: paged attention through
// scrambled block tables equals flash attention over a contiguous cache
// holding the same quantized rows, for every type, awkward lengths and GQA
// ratios; byte-for-byte copy-on-write; clear refusal of block types for head
// sizes that are not whole 32-element blocks; pool sizing per type.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "kernels/attention.h"
#include "kernels/flash_attention.h"
#include "kernels/paged_attention.h"
#include "kv/contiguous_kv_cache.h"
#include "kv/paged_kv_storage.h"
#include "model/model.h"
#include "model/synth.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::random_vector;
using kvserve::test_util::relative_error;

namespace {

constexpr KVType kPagedKvTypes[] = {KVType::F32, KVType::F16, KVType::BF16, KVType::Q8_0, KVType::FP8, KVType::Q4_0};

// One sequence's K/V in a contiguous cache and, with the same quantized
// rows, in a paged storage whose blocks are handed out in scrambled order.
struct PagedCase {
  int64_t n_q, pos0;
  std::vector<float> q, out;
  std::vector<BlockId> table;
  std::vector<const uint8_t*> k_bases, v_bases;
  std::unique_ptr<ContiguousKVCache> contiguous;
  int64_t n_kv() const { return pos0 + n_q; }
};

void fill(PagedCase& c, PagedKVStorage& paged, BlockId& next_block, const AttentionShape& s, KVType type,
          std::mt19937& rng) {
  const int64_t kvd = s.n_kv_heads * s.head_dim, B = paged.block_size();
  c.q = random_vector(static_cast<size_t>(c.n_q * s.n_heads * s.head_dim), rng, 1.0f);
  c.out.assign(c.q.size(), 0.0f);
  c.contiguous = std::make_unique<ContiguousKVCache>(1, c.n_kv(), s.n_kv_heads, s.head_dim, type);
  for (int64_t b = 0; b * B < c.n_kv(); ++b) c.table.push_back(next_block--);  // descending physical ids
  for (int64_t p = 0; p < c.n_kv(); ++p) {
    const std::vector<float> k = random_vector(static_cast<size_t>(kvd), rng, 1.0f);
    const std::vector<float> v = random_vector(static_cast<size_t>(kvd), rng, 1.0f);
    c.contiguous->write(0, p, k.data(), v.data());
    paged.write(0, c.table[static_cast<size_t>(p / B)], p % B, k.data(), v.data());
  }
  paged.append_block_bases(0, c.table, c.k_bases, c.v_bases);
}

std::vector<float> contiguous_attention(const PagedCase& c, const AttentionShape& s) {
  std::vector<float> want(c.q.size());
  flash_attention(c.q.data(), c.n_q, c.pos0, c.contiguous->k_rows(0), c.contiguous->v_rows(0), c.n_kv(), s,
                  want.data());
  return want;
}

// Runs the cases as one batch (work items over sequences) and one by one
// (flash attention's own split-K path for a long decode).
void check_paged_equals_contiguous(KVType type, const AttentionShape& s, int64_t B) {
  std::mt19937 rng(11);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 0}, {1, 13}, {7, 0}, {5, 9}, {33, 3}, {1, 40}, {2, 600}};
  int64_t blocks = 0;
  for (auto [n_q, pos0] : shapes) blocks += (n_q + pos0 + B - 1) / B;
  PagedKVStorage paged(1, blocks, B, s.n_kv_heads, s.head_dim, type);
  BlockId next = static_cast<BlockId>(blocks - 1);
  std::vector<PagedCase> cases(shapes.size());
  std::vector<PagedAttentionJob> jobs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    cases[i].n_q = shapes[i].first;
    cases[i].pos0 = shapes[i].second;
    fill(cases[i], paged, next, s, type, rng);
  }
  for (PagedCase& c : cases)
    jobs.push_back({c.q.data(), c.n_q, c.pos0, paged.k_rows(c.k_bases.data()), paged.v_rows(c.v_bases.data()), c.out.data()});
  paged_attention(jobs, s);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<float> want = contiguous_attention(cases[i], s);
    EXPECT_LT(relative_error(cases[i].out, want), 1e-5) << kv_type_info(type).name << " batch case " << i;
    std::fill(cases[i].out.begin(), cases[i].out.end(), 0.0f);
    paged_attention(std::span(&jobs[i], 1), s);
    EXPECT_LT(relative_error(cases[i].out, want), 1e-5) << kv_type_info(type).name << " alone case " << i;
  }
}

}  // namespace

TEST(PagedKV, AttentionEqualsContiguousForEveryKVType) {
  for (KVType type : kPagedKvTypes) {
    check_paged_equals_contiguous(type, {6, 2, 32}, 5);   // GQA 3, blocks of 5 tokens
    check_paged_equals_contiguous(type, {8, 1, 64}, 16);  // GQA 8 (MQA)
    check_paged_equals_contiguous(type, {4, 4, 32}, 3);   // MHA
  }
  for (KVType type : {KVType::F32, KVType::F16, KVType::BF16}) check_paged_equals_contiguous(type, {6, 2, 8}, 4);
}

TEST(PagedKV, F32PagedAttentionEqualsTheReference) {
  std::mt19937 rng(3);
  const AttentionShape s{6, 2, 8};
  PagedCase c;
  c.n_q = 9;
  c.pos0 = 21;
  PagedKVStorage paged(1, 8, 4, s.n_kv_heads, s.head_dim);
  BlockId next = 7;
  fill(c, paged, next, s, KVType::F32, rng);
  const PagedAttentionJob job{c.q.data(), c.n_q, c.pos0, paged.k_rows(c.k_bases.data()), paged.v_rows(c.v_bases.data()),
                              c.out.data()};
  paged_attention(std::span(&job, 1), s);
  const int64_t kvd = s.n_kv_heads * s.head_dim;
  std::vector<float> k(static_cast<size_t>(c.n_kv() * kvd)), v(k.size()), want(c.q.size());
  dequantize_kv_rows(c.contiguous->k_rows(0), c.n_kv(), s.n_kv_heads, s.head_dim, k.data());
  dequantize_kv_rows(c.contiguous->v_rows(0), c.n_kv(), s.n_kv_heads, s.head_dim, v.data());
  attention_reference(c.q.data(), c.n_q, c.pos0, k.data(), v.data(), c.n_kv(), kvd, s, want.data());
  EXPECT_LT(relative_error(c.out, want), 1e-5);
}

TEST(PagedKV, BlockTypesRefuseHeadSizesThatAreNotWholeBlocks) {
  for (KVType type : {KVType::Q8_0, KVType::FP8, KVType::Q4_0}) {
    try {
      PagedKVStorage storage(2, 4, 16, 2, 48, type);
      FAIL() << "head size 48 accepted for " << kv_type_info(type).name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("head size is 48"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("f16"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(PagedKVStorage(2, 4, 16, 2, 48, KVType::BF16));
}

TEST(PagedKV, CopyBlockCopiesTypedRowsByteForByte) {
  std::mt19937 rng(9);
  PagedKVStorage s(2, 3, 4, 2, 32, KVType::Q8_0);
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t slot = 0; slot < 4; ++slot) {
      const std::vector<float> k = random_vector(64, rng, 2.0f), v = random_vector(64, rng, 0.5f);
      s.write(l, 1, slot, k.data(), v.data());
    }
  s.copy_block(1, 2);
  const size_t bytes = 4 * s.row_bytes();
  EXPECT_EQ(s.row_bytes(), 2u * 34u * 1u);  // two heads of one q8_0 block each
  for (int64_t l = 0; l < 2; ++l) {
    EXPECT_EQ(std::memcmp(s.k_block(l, 1), s.k_block(l, 2), bytes), 0);
    EXPECT_EQ(std::memcmp(s.v_block(l, 1), s.v_block(l, 2), bytes), 0);
  }
}

TEST(PagedKV, PoolSizeFollowsTheTypesBytesPerToken) {
  kvserve::test_util::TempFile file(".gguf");
  kvserve::test_util::write_synth_model(file.path(), "tiny-hd32");
  auto model = Model::load(file.path());
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  const ModelConfig& c = model->config();
  for (KVType type : kPagedKvTypes) {
    EngineOptions o;
    o.kv_type = type;
    o.kv_memory_bytes = 1 << 20;
    const int64_t per_block = PagedKVStorage::bytes_per_block(c.n_layers, o.block_size, c.n_kv_heads, c.head_dim, type);
    EXPECT_EQ(per_block, 2 * c.n_layers * o.block_size * c.n_kv_heads *
                             kv_vector_bytes(type, c.head_dim)) << kv_type_info(type).name;
    Engine engine(*model, tok, o);
    EXPECT_EQ(engine.metrics().kv_blocks_total, (1 << 20) / per_block) << kv_type_info(type).name;
  }
  EngineOptions o;
  o.kv_type = KVType::Q8_0;
  kvserve::test_util::TempFile small(".gguf");
  kvserve::test_util::write_synth_model(small.path(), "tiny-llama");  // head size 16
  auto tiny = Model::load(small.path());
  EXPECT_THROW(Engine(*tiny, Tokenizer::from_gguf(tiny->file()), o), Error);
}

// Batch invariance (issue #15): a sequence's results must be bitwise the same
// whatever else runs with it.
//  * Kernel level: a query row of flash_attention / paged_attention gives the
//    same bits whatever the chunk of rows it is computed in (1, 3, 16, all;
//    aligned or not), 1 to 4 OpenMP threads, alone or with other jobs in
//    the span, contiguous or paged, for every KV type and lengths crossing key
//    tiles (64), key splits (256) and blocks (16).
//  * Per-row ops (rmsnorm_rows, rope, silu_mul, add_inplace): a row alone vs
//    inside a long batch, 1 vs 2 threads.
//  * Model level (the real default model, skipped when absent): logits of one
//    sequence alone vs inside a step with 15 others, prefill in one chunk vs
//    chunks of 1/7/64, 1 vs 2 threads, a 5-token verification pass vs the same
//    tokens one at a time, a 512-token context (flash-decoding alone vs one
//    work item per head in a batch); compared with memcmp. With 8-bit
//    activations (kQ8) all pass. With exact f32 activations only the thread
//    count is invariant: the f32-activation matmul kernels' last bits depend
//    on the token count, so those tests are DISABLED_ (see there).
//  * The same model-level checks on the default model re-encoded as f16
//    (F16BatchInvariance): the float GEMM over repacked rows keeps one fma
//    chain per (row, token), with exact f32 activations, so they pass.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/flash_attention.h"
#include "kernels/float_packed.h"
#include "kernels/ops.h"
#include "kernels/paged_attention.h"
#include "kv/contiguous_kv_cache.h"
#include "kv/kv_cache_manager.h"
#include "kv/paged_kv_storage.h"
#include "model/model.h"
#include "model/quantize_model.h"
#include "model/transformer.h"
#include "test_util.h"

using namespace kvserve;
using kvserve::test_util::random_vector;

namespace {

// Sets the OpenMP threads of later parallel regions on this thread; restores them.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : previous_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(previous_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int previous_;
};

// "" when a and b hold the same bits, else where they differ most.
std::string bitwise_diff(const float* a, const float* b, int64_t n, int64_t row_width) {
  if (std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0) return "";
  double max_diff = 0;
  int64_t at = -1, n_diff = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    ++n_diff;
    const double d = std::isnan(a[i]) || std::isnan(b[i]) ? INFINITY : std::fabs(double(a[i]) - double(b[i]));
    if (at < 0 || d > max_diff) max_diff = d, at = i;
  }
  std::ostringstream s;
  s << n_diff << " of " << n << " floats differ; max |diff| " << max_diff << " at row " << at / row_width
    << ", column " << at % row_width << " (" << a[at] << " vs " << b[at] << ")";
  return s.str();
}

// ---------------------------------------------------------------------------
// Kernel level

constexpr KVType kAllTypes[] = {KVType::F32, KVType::F16, KVType::BF16, KVType::Q8_0, KVType::FP8, KVType::Q4_0};
constexpr AttentionShape kShape{4, 2, 32};  // GQA 2; head size 32 fits every KV type
constexpr int64_t kBlock = 16;
constexpr int64_t kQWidth = kShape.n_heads * kShape.head_dim;

// One sequence: queries for all its positions and its K/V rows in the paged
// storage (blocks in scrambled order) and, for the target, in a contiguous cache.
struct Sequence {
  int64_t len = 0;
  std::vector<float> q;  // [len][kQWidth]
  std::vector<BlockId> table;
  std::vector<const uint8_t*> k_bases, v_bases;
};

struct AttentionFixture {
  KVType type;
  AttentionShape shape = kShape;  // tests of sliding windows set shape.window
  std::unique_ptr<PagedKVStorage> paged;
  std::unique_ptr<ContiguousKVCache> contiguous;  // the target's rows
  Sequence target;
  std::vector<Sequence> others;
  std::vector<std::vector<float>> other_out;
  // Other jobs: (length, query rows at the end).
  static constexpr std::pair<int64_t, int64_t> kOthers[] = {{700, 1}, {45, 45}, {300, 5}, {2, 2}};

  AttentionFixture(KVType t, int64_t len) : type(t) {
    std::mt19937 rng(static_cast<uint32_t>(len * 7 + static_cast<int>(t)));
    int64_t blocks = (len + kBlock - 1) / kBlock;
    for (auto [n, rows] : kOthers) blocks += (n + kBlock - 1) / kBlock;
    paged = std::make_unique<PagedKVStorage>(1, blocks, kBlock, kShape.n_kv_heads, kShape.head_dim, type);
    contiguous = std::make_unique<ContiguousKVCache>(1, len, kShape.n_kv_heads, kShape.head_dim, type);
    // Physical blocks handed out interleaved and backwards: no sequence is contiguous.
    std::vector<BlockId> free_blocks;
    for (int64_t b = blocks - 1; b >= 0; --b) free_blocks.push_back(static_cast<BlockId>(b));
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
    size_t next = 0;
    auto fill = [&](Sequence& s, int64_t n, bool also_contiguous) {
      s.len = n;
      s.q = random_vector(static_cast<size_t>(n * kQWidth), rng, 1.0f);
      const int64_t kvd = kShape.n_kv_heads * kShape.head_dim;
      for (int64_t b = 0; b * kBlock < n; ++b) s.table.push_back(free_blocks[next++]);
      for (int64_t p = 0; p < n; ++p) {
        // Keys scaled up: peaky rows, so a split's max often differs from the row's.
        const std::vector<float> k = random_vector(static_cast<size_t>(kvd), rng, 2.0f);
        const std::vector<float> v = random_vector(static_cast<size_t>(kvd), rng, 1.0f);
        paged->write(0, s.table[static_cast<size_t>(p / kBlock)], p % kBlock, k.data(), v.data());
        if (also_contiguous) contiguous->write(0, p, k.data(), v.data());
      }
      paged->append_block_bases(0, s.table, s.k_bases, s.v_bases);
    };
    fill(target, len, true);
    for (auto [n, rows] : kOthers) {
      others.emplace_back();
      fill(others.back(), n, false);
      other_out.emplace_back(static_cast<size_t>(rows * kQWidth));
    }
  }

  enum class Mode { kContiguous, kPagedAlone, kPagedFirst, kPagedMiddle };

  // Rows [start, start + n) of the target computed in one call.
  std::vector<float> run(int64_t start, int64_t n, Mode mode) {
    std::vector<float> out(static_cast<size_t>(n * kQWidth), std::nanf(""));
    const float* q = target.q.data() + start * kQWidth;
    if (mode == Mode::kContiguous) {
      flash_attention(q, n, start, contiguous->k_rows(0), contiguous->v_rows(0), start + n, shape, out.data());
      return out;
    }
    const PagedAttentionJob mine{q, n, start, paged->k_rows(target.k_bases.data()), paged->v_rows(target.v_bases.data()),
                                 out.data()};
    std::vector<PagedAttentionJob> jobs;
    if (mode != Mode::kPagedAlone) {
      for (size_t i = 0; i < others.size(); ++i) {
        const Sequence& s = others[i];
        const int64_t rows = kOthers[i].second, pos0 = s.len - rows;
        jobs.push_back({s.q.data() + pos0 * kQWidth, rows, pos0, paged->k_rows(s.k_bases.data()),
                        paged->v_rows(s.v_bases.data()), other_out[i].data()});
      }
    }
    jobs.insert(mode == Mode::kPagedMiddle ? jobs.begin() + static_cast<int64_t>(jobs.size() / 2) : jobs.begin(),
                mine);
    paged_attention(jobs, shape);
    return out;
  }
};

const char* mode_name(AttentionFixture::Mode m) {
  switch (m) {
    case AttentionFixture::Mode::kContiguous: return "contiguous";
    case AttentionFixture::Mode::kPagedAlone: return "paged alone";
    case AttentionFixture::Mode::kPagedFirst: return "paged, first of 5 jobs";
    case AttentionFixture::Mode::kPagedMiddle: return "paged, middle of 5 jobs";
  }
  return "?";
}

// Rows worth checking: both sides of key-tile (64), split (256) and block (16) boundaries.
std::vector<int64_t> probe_rows(int64_t len, int64_t from = 0) {
  std::set<int64_t> rows;
  for (int64_t r : {0, 15, 16, 31, 32, 63, 64, 65, 255, 256, 257, 511, 512, 2047, 2048, 2303, 2304})
    if (r >= from && r < len) rows.insert(r);
  for (int64_t r : {len - 2, len - 1})
    if (r >= from && r >= 0) rows.insert(r);
  return {rows.begin(), rows.end()};
}

// Calls [start, start + n) that contain probe row i for chunk size c: the
// chunk aligned to multiples of c, and the one that ends at i (other pos0).
std::set<std::pair<int64_t, int64_t>> chunks_for(const std::vector<int64_t>& probes, int64_t c, int64_t len) {
  std::set<std::pair<int64_t, int64_t>> calls;
  for (int64_t i : probes)
    for (int64_t start : {i - i % c, std::max<int64_t>(0, i - c + 1)}) calls.insert({start, std::min(c, len - start)});
  return calls;
}

// Every probe row of every call equals `want` (rows [want_start, ...)) bit for bit.
void expect_rows_equal(AttentionFixture& f, const std::vector<float>& want, int64_t want_start,
                       const std::vector<int64_t>& probes, const std::vector<int64_t>& chunk_sizes,
                       const std::vector<int>& threads) {
  using Mode = AttentionFixture::Mode;
  const int64_t len = f.target.len;
  for (int64_t c : chunk_sizes)
    for (auto [start, n] : chunks_for(probes, c, len))
      for (int t : threads) {
        const ScopedThreads scoped(t);
        // Contiguous and paged alone run the same flash_attention; on 2+
        // threads only the paged ones (fewer parallel regions: slow on a busy host).
        const std::vector<Mode> modes = t == 1
                                            ? std::vector<Mode>{Mode::kContiguous, Mode::kPagedAlone, Mode::kPagedFirst}
                                            : std::vector<Mode>{Mode::kPagedAlone, Mode::kPagedMiddle};
        for (Mode mode : modes) {
          const std::vector<float> got = f.run(start, n, mode);
          for (int64_t i = start; i < start + n; ++i) {
            if (i < want_start) continue;
            const std::string diff =
                bitwise_diff(got.data() + (i - start) * kQWidth, want.data() + (i - want_start) * kQWidth, kQWidth,
                             kQWidth);
            ASSERT_EQ(diff, "") << kv_type_info(f.type).name << " length " << len << ": row " << i
                                << " computed in rows [" << start << ", " << start + n << "), " << t
                                << " thread(s), " << mode_name(mode);
          }
        }
      }
}

// The target's rows from one call on one thread (contiguous) against the same
// rows from calls of every size, threads and mode (expect_rows_equal).
void expect_every_call_gives_the_rows_of_one(AttentionFixture& f, int64_t len) {
  std::vector<float> want;
  {
    const ScopedThreads one(1);
    want = f.run(0, len, AttentionFixture::Mode::kContiguous);
  }
  const std::vector<int64_t> probes = probe_rows(len);
  // The whole sequence in one call: 1 and 2 threads, every mode.
  expect_rows_equal(f, want, 0, probes, {len}, {1, 2});
  // 2 threads matter most for 1-4 rows (flash-decoding's choice); a busy
  // host makes every 2-thread call slow, so chunks of 16 run on one.
  expect_rows_equal(f, want, 0, probes, {1, 3}, {1, 2});
  expect_rows_equal(f, want, 0, probes, {16}, {1});
}

}  // namespace

// Row i in calls of 1, 3, 16 and all rows, aligned or not, 1 or 2 threads,
// contiguous, paged alone and paged among 4 other jobs (first or in the
// middle; a 700-key decode, a 45-row prefill, ...) against the whole
// sequence in one call on one thread.
// Before fixed key splits this failed for lengths >= 512: a short call alone
// took flash-decoding (keys split in n_kv / n_threads-dependent chunks,
// merged in another order) while a long call or a batch did not.
TEST(BatchInvariance, AttentionRowDoesNotDependOnChunkThreadsOrBatch) {
  const bool slow_build = test_util::skip_slow();
  for (KVType type : kAllTypes)
    for (int64_t len : {1, 31, 33, 100, 257, 520}) {
      // The sanitizer build: past 33 keys F32 (to 257, one key split) and Q8_0 only.
      if (slow_build && len > 33 && type != KVType::Q8_0 && (type != KVType::F32 || len > 257)) continue;
      AttentionFixture f(type, len);
      expect_every_call_gives_the_rows_of_one(f, len);
      if (HasFatalFailure()) return;
    }
}

// Sliding windows (Gemma 3): skipping the tiles and splits before a row's
// window must not change the row's arithmetic, whatever the call.
TEST(BatchInvariance, SlidingWindowRowDoesNotDependOnChunkThreadsOrBatch) {
  for (KVType type : {KVType::F32, KVType::Q8_0})
    for (int64_t window : {40, 300})
      for (int64_t len : {100, 520}) {
        if (test_util::skip_slow() && type == KVType::F32) continue;  // the sanitizer build: the dequantizing path only
        AttentionFixture f(type, len);
        f.shape.window = window;
        expect_every_call_gives_the_rows_of_one(f, len);
        if (HasFatalFailure()) return;
      }
}

// Long contexts: the decode path's key splits used to be n_kv / 256 capped at
// 4 x threads, so past 2048 keys 2 and 3 threads merged different splits.
TEST(BatchInvariance, LongContextDecodeDoesNotDependOnThreads) {
  // f16 / bf16 (the CLI's default KV type): rows widened as loaded in decode, a dequantized tile in prefill.
  for (KVType type : {KVType::F32, KVType::Q8_0, KVType::F16, KVType::BF16}) {
    if (test_util::skip_slow() && type != KVType::Q8_0) continue;  // the sanitizer build: the dequantizing path only
    const int64_t len = 2500;
    AttentionFixture f(type, len);
    const int64_t from = len - 48;  // reference: the last 48 rows, one call (prefill path), one thread
    std::vector<float> want;
    {
      const ScopedThreads one(1);
      want = f.run(from, len - from, AttentionFixture::Mode::kContiguous);
    }
    expect_rows_equal(f, want, from, {from + 15, from + 16, len - 1}, {1, 3, 16}, {1, 2, 3, 4});
    if (HasFatalFailure()) return;
  }
}

// The element-wise and per-row ops of the batched forward pass: a row inside
// a batch of 40 (split over 1 or 2 threads) equals the row alone.
TEST(BatchInvariance, PerRowOpsDoNotDependOnTheBatch) {
  std::mt19937 rng(9);
  const int64_t dim = 576, rows = 40, row = 17;
  const std::vector<float> x = random_vector(static_cast<size_t>(rows * dim), rng, 1.0f);
  const std::vector<float> y = random_vector(static_cast<size_t>(rows * dim), rng, 1.0f);
  const std::vector<float> w = random_vector(static_cast<size_t>(dim), rng, 1.0f);
  const float* xr = x.data() + row * dim;
  const float* yr = y.data() + row * dim;
  std::vector<float> alone(static_cast<size_t>(dim));
  rmsnorm_rows(xr, w.data(), 1, dim, 1e-5f, alone.data());
  std::vector<float> silu_alone(xr, xr + dim), add_alone(xr, xr + dim), rope_alone(xr, xr + dim);
  silu_mul(silu_alone.data(), yr, dim);
  add_inplace(add_alone.data(), yr, dim);
  rope(rope_alone.data(), 9, 64, 64, 1234, 10000.0f, false);
  for (int threads : {1, 2}) {
    const ScopedThreads scoped(threads);
    std::vector<float> batch(x.size());
    rmsnorm_rows(x.data(), w.data(), rows, dim, 1e-5f, batch.data());
    EXPECT_EQ(bitwise_diff(batch.data() + row * dim, alone.data(), dim, dim), "") << "rmsnorm, " << threads;
    std::vector<float> g = x;
    silu_mul(g.data(), y.data(), rows * dim);
    EXPECT_EQ(bitwise_diff(g.data() + row * dim, silu_alone.data(), dim, dim), "") << "silu_mul, " << threads;
    std::vector<float> a = x;
    add_inplace(a.data(), y.data(), rows * dim);
    EXPECT_EQ(bitwise_diff(a.data() + row * dim, add_alone.data(), dim, dim), "") << "add_inplace, " << threads;
    std::vector<float> r(xr, xr + dim);
    rope(r.data(), 9, 64, 64, 1234, 10000.0f, false);
    EXPECT_EQ(bitwise_diff(r.data(), rope_alone.data(), dim, dim), "") << "rope, " << threads;
  }
}

// ---------------------------------------------------------------------------
// Model level: SmolLM2-135M (q4_1) through Transformer::forward_batch.

namespace {

// One sequence of a schedule: its tokens and how many have run.
struct Seq {
  SequenceId id = 0;
  std::vector<int32_t> tokens;
  int64_t done = 0;
};

// A step's share for one sequence: its next n tokens, logits for the last
// `logits` of them (0: all n).
struct Share {
  Seq* seq;
  int64_t n;
  int64_t logits = 0;
};

constexpr SequenceId kTarget = 1;

// Runs steps of forward_batch over the paged cache and keeps the target
// sequence's logits by position.
class Runner {
 public:
  static constexpr int64_t kBlockSize = 16;

  // free_sliding: a model's sliding-window layers get their own pool, which
  // frees the blocks behind the window (the engine's default), else every
  // layer keeps every position.
  Runner(const Model& m, int64_t n_blocks, bool free_sliding, KVType kv_type)
      : model_(m),
        kv_(manager(m.config(), n_blocks, free_sliding)),
        storage_(storage(m.config(), n_blocks, free_sliding, kv_type)),
        t_(m, AttentionKernel::kFlash) {}

  // One forward_batch over the shares, in this order.
  void step(const std::vector<Share>& shares) {
    std::vector<BlockCopy> copies;
    std::vector<SequenceChunk> chunks;
    int64_t rows = 0;
    for (const Share& s : shares) {
      ASSERT_TRUE(kv_.allocate(s.seq->id, s.seq->done, s.seq->done + s.n, copies));
      ASSERT_TRUE(copies.empty());
      rows += s.logits > 0 ? s.logits : s.n;
    }
    for (const Share& s : shares)
      chunks.push_back({std::span<const int32_t>(s.seq->tokens).subspan(static_cast<size_t>(s.seq->done),
                                                                         static_cast<size_t>(s.n)),
                        s.seq->done, kv_.blocks(s.seq->id), true, s.logits > 0 ? s.logits : s.n,
                        kv_.sliding_blocks(s.seq->id)});
    const int64_t vocab = model_.config().vocab_size;
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    t_.forward_batch(chunks, storage_, logits.data());
    int64_t row = 0;
    for (const Share& s : shares) {
      const int64_t wanted = s.logits > 0 ? s.logits : s.n;
      for (int64_t pos = s.seq->done + s.n - wanted; pos < s.seq->done + s.n; ++pos, ++row)
        if (s.seq->id == kTarget)
          logits_[pos].assign(logits.begin() + row * vocab, logits.begin() + (row + 1) * vocab);
      s.seq->done += s.n;
    }
  }
  // The target's logits at `pos`; empty when that row's were not asked for.
  std::vector<float> logits(int64_t pos) const {
    const auto it = logits_.find(pos);
    return it == logits_.end() ? std::vector<float>() : it->second;
  }

 private:
  static KVCacheManager manager(const ModelConfig& c, int64_t n_blocks, bool free_sliding) {
    if (!free_sliding || c.sliding_window == 0) return KVCacheManager(n_blocks, kBlockSize, false);
    return KVCacheManager(n_blocks, kBlockSize, false, SlidingKVGroup{c.sliding_window, n_blocks});
  }
  static PagedKVStorage storage(const ModelConfig& c, int64_t n_blocks, bool free_sliding, KVType type) {
    if (!free_sliding || c.sliding_window == 0)
      return PagedKVStorage(c.n_layers, n_blocks, kBlockSize, c.n_kv_heads, c.head_dim, type);
    return PagedKVStorage(c.layer_is_sliding, n_blocks, n_blocks, kBlockSize, c.n_kv_heads, c.head_dim, type);
  }

  const Model& model_;
  KVCacheManager kv_;
  PagedKVStorage storage_;
  Transformer t_;
  std::map<int64_t, std::vector<float>> logits_;
};

std::vector<int32_t> random_tokens(int64_t n, uint32_t seed, int64_t vocab) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(100, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = id(rng);
  return t;
}

constexpr int64_t kVerify = 5;  // tokens after the prompt (decode steps, or one verification pass)

// How the target's prompt is computed.
struct Schedule {
  int64_t prompt;
  int64_t chunk = 0;           // prefill chunk (0: the whole prompt at once)
  bool verify_pass = false;    // the kVerify tokens in one pass (else one per step)
  int threads = 1;
  bool batch = false;          // among 15 other sequences
  bool prompt_logits = true;   // logits for every prompt row (else the last one only)
  bool free_sliding = true;    // sliding-window layers free the blocks behind the window (Runner)
  KVType kv_type = KVType::F32;
};

class BatchInvarianceModel : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    const std::string path = test_util::default_model_path();
    if (!path.empty()) model_ = Model::load(path).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "default model not fetched (run scripts/fetch_models.sh)";
  }
  static int64_t vocab() { return model_->config().vocab_size; }

  // The target sequence (its prompt then kVerify tokens) under schedule s.
  // Alone: the prompt in chunks, then the kVerify tokens. In a batch (2
  // threads or 1): 7 others prefill in step 1; step 2 prefills the target
  // (mid-list), 8 more prompts (1 to 64 tokens) and a decode token of each of
  // the first 7; then the target decodes one token per step among 5 of the
  // others, a different 5 each step (sequences come and go).
  static std::unique_ptr<Runner> run(const Schedule& s) {
    const ScopedThreads scoped(s.threads);
    Seq t{kTarget, random_tokens(s.prompt + kVerify, 1, vocab())};
    std::vector<Seq> others;
    int64_t blocks = (s.prompt + kVerify) / Runner::kBlockSize + 2;
    if (s.batch)
      for (int i = 0; i < 15; ++i) {
        const int64_t n = 1 + (i * 37 + 11) % 64 + kVerify + 1;
        others.push_back({static_cast<SequenceId>(100 + i), random_tokens(n, 100 + i, vocab())});
        blocks += n / Runner::kBlockSize + 2;
      }
    auto prompt_of = [](const Seq& o) { return static_cast<int64_t>(o.tokens.size()) - kVerify - 1; };
    auto r = std::make_unique<Runner>(*model_, blocks, s.free_sliding, s.kv_type);
    const int64_t chunk = s.chunk > 0 ? s.chunk : s.prompt;
    if (s.batch) {
      std::vector<Share> step1, step2;
      for (int i = 0; i < 7; ++i) step1.push_back({&others[i], prompt_of(others[i]), 1});
      r->step(step1);
      for (int i = 0; i < 7; ++i) step2.push_back({&others[i], 1});
      step2.push_back({&t, s.prompt, s.prompt_logits ? 0 : 1});
      for (int i = 7; i < 15; ++i) step2.push_back({&others[i], prompt_of(others[i]), 1});
      r->step(step2);
    } else {
      while (t.done < s.prompt) {
        const int64_t n = std::min(chunk, s.prompt - t.done);
        r->step({{&t, n, s.prompt_logits || t.done + n == s.prompt ? 0 : 1}});
      }
    }
    if (s.verify_pass) {
      r->step({{&t, kVerify}});
      return r;
    }
    for (int64_t k = 0; k < kVerify; ++k) {
      std::vector<Share> step;
      for (int i = 0; i < static_cast<int>(others.size()); ++i)
        if (i % 3 == static_cast<int>(k % 3)) step.push_back({&others[i], 1});
      step.insert(step.begin() + static_cast<int64_t>(step.size() / 2), Share{&t, 1});
      r->step(step);
    }
    return r;
  }

  // Every position whose logits both runs have agrees bit for bit.
  static void expect_same_logits(const Schedule& want_schedule, const Schedule& got_schedule,
                                 const std::string& what) {
    const auto want = run(want_schedule);
    const auto got = run(got_schedule);
    int64_t compared = 0;
    for (int64_t pos = 0; pos < want_schedule.prompt + kVerify; ++pos) {
      const std::vector<float> a = got->logits(pos), b = want->logits(pos);
      if (a.empty() || b.empty()) continue;
      ++compared;
      const std::string diff = bitwise_diff(a.data(), b.data(), vocab(), vocab());
      ASSERT_EQ(diff, "") << what << ": logits at position " << pos << " (prompt " << want_schedule.prompt << ")";
    }
    EXPECT_GE(compared, kVerify + 1) << what;
  }

  static Model* model_;
};

Model* BatchInvarianceModel::model_ = nullptr;

// The same checks on Gemma 3 270M (scripts/fetch_models.sh --gemma3; skipped
// without it): head size 256, one K/V head, and sliding-window layers whose
// window (512 keys) a long prompt runs past.
class Gemma3BatchInvariance : public BatchInvarianceModel {
 public:
  static void SetUpTestSuite() {
    const std::string path = test_util::model_dir() + "/gemma-3-270m-q4_k_m.gguf";
    if (std::filesystem::exists(path)) model_ = Model::load(path).release();
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "Gemma 3 270M not fetched (scripts/fetch_models.sh --gemma3)";
  }
};

// The default model re-encoded as f16 (kvserve quantize ... f16; lossless
// from its q4_1 values), so every matrix goes through the float GEMM over
// repacked rows (kernels/float_packed.h). Skipped without the default model.
class F16BatchInvariance : public BatchInvarianceModel {
 public:
  static void SetUpTestSuite() {
    const std::string source = test_util::default_model_path();
    if (source.empty()) return;
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("kvserve-f16-invariance-" + std::to_string(::getpid()) + ".gguf")).string();
    quantize_model(source, path, DType::F16);
    model_ = Model::load(path).release();
    std::filesystem::remove(path);  // the mapping keeps the file's pages
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "default model not fetched (run scripts/fetch_models.sh)";
    ASSERT_EQ(model_->weights().layers[0].wq.type, DType::F16);
    if (model_->weights().layers[0].wq.packed == nullptr)
      GTEST_SKIP() << "float matrices not repacked (KVSERVE_REPACK=0, or no SIMD kernel table)";
  }
};

// The checks, each under one activation precision (the model has none of its
// own, so the scope decides).

void prefill_chunk_sizes(ActivationPrecision p) {
  const ScopedActivationPrecision precision(p);
  for (int64_t chunk : {64, 7, 1}) {
    BatchInvarianceModel::expect_same_logits({90}, {90, chunk}, "prefill in chunks of " + std::to_string(chunk));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

void verification_pass(ActivationPrecision p) {
  const ScopedActivationPrecision precision(p);
  BatchInvarianceModel::expect_same_logits({70, 0, false, 1}, {70, 0, true, 1}, "verification pass of 5 tokens");
}

void one_vs_two_threads(ActivationPrecision p) {
  const ScopedActivationPrecision precision(p);
  BatchInvarianceModel::expect_same_logits({70, 32, false, 1}, {70, 32, false, 2}, "2 threads vs 1");
}

void alone_vs_batch(ActivationPrecision p) {
  const ScopedActivationPrecision precision(p);
  BatchInvarianceModel::expect_same_logits({80, 0, false, 1}, {80, 0, false, 1, true}, "in a batch of 16");
}

// A 512-token context on 2 threads: alone, a decode step's attention splits
// the keys over the threads (flash-decoding, from 512 keys); in the batch each
// sequence is one work item per K/V head. Before fixed key splits the logits
// differed by up to 0.47 here.
void long_context_alone_vs_batch(ActivationPrecision p) {
  const ScopedActivationPrecision precision(p);
  BatchInvarianceModel::expect_same_logits({512, 0, false, 2, false, false}, {512, 0, false, 2, true, false},
                                           "512-token context in a batch of 16");
}

// The CLI's default KV type (f16) at long context: 2100 tokens (9 key splits)
// (Gemma: 800, past its 512-key window) alone vs among 15 others, and in one
// prefill on 1 thread vs chunks of 512 on 2.
void f16_long_context(int64_t prompt) {
  const ScopedActivationPrecision precision(ActivationPrecision::kQ8);
  Schedule alone{prompt, 0, false, 2, false, false};
  alone.kv_type = KVType::F16;
  Schedule batch = alone;
  batch.batch = true;
  BatchInvarianceModel::expect_same_logits(alone, batch, std::to_string(prompt) + "-token f16 context in a batch of 16");
  if (::testing::Test::HasFatalFailure()) return;
  Schedule one_thread = alone, chunked = alone;
  one_thread.threads = 1;
  chunked.chunk = 512;
  BatchInvarianceModel::expect_same_logits(one_thread, chunked,
                                           std::to_string(prompt) + "-token f16 context in chunks of 512 on 2 threads");
}

}  // namespace

TEST_F(BatchInvarianceModel, RealModelQ8F16LongContext) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  f16_long_context(2100);
}
TEST_F(Gemma3BatchInvariance, RealModelQ8F16LongContext) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  f16_long_context(800);
}

// 8-bit activations (--activations q8, about to become the default): the
// mode issue #15 makes batch-invariant. Needs the q8 matmuls over repacked
// weights (one float chain per row and token for every token count) and
// attention's fixed key splits.
TEST_F(BatchInvarianceModel, RealModelQ8PrefillChunkSizes) { prefill_chunk_sizes(ActivationPrecision::kQ8); }
TEST_F(BatchInvarianceModel, RealModelQ8VerificationPassVsOneAtATime) { verification_pass(ActivationPrecision::kQ8); }
TEST_F(BatchInvarianceModel, RealModelQ8OneVsTwoThreads) { one_vs_two_threads(ActivationPrecision::kQ8); }
TEST_F(BatchInvarianceModel, RealModelQ8AloneVsBatchOf16) { alone_vs_batch(ActivationPrecision::kQ8); }
TEST_F(BatchInvarianceModel, RealModelQ8LongContextAloneVsBatch) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  long_context_alone_vs_batch(ActivationPrecision::kQ8);
}

TEST_F(Gemma3BatchInvariance, RealModelQ8PrefillChunkSizes) { prefill_chunk_sizes(ActivationPrecision::kQ8); }
TEST_F(Gemma3BatchInvariance, RealModelQ8AloneVsBatchOf16) { alone_vs_batch(ActivationPrecision::kQ8); }
// 600 tokens: the sliding layers' queries past position 511 skip the first keys.
TEST_F(Gemma3BatchInvariance, RealModelQ8PastTheWindowAloneVsBatch) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  const ScopedActivationPrecision precision(ActivationPrecision::kQ8);
  expect_same_logits({600, 0, false, 2, false, false}, {600, 0, false, 2, true, false},
                     "600-token context in a batch of 16");
  expect_same_logits({600, 0, false, 1, false, false}, {600, 256, false, 2, false, false},
                     "600-token context in chunks of 256 on 2 threads");
}
// The sliding layers' own pool (the engine's default) frees the blocks the
// window has passed (the decode steps at 600..604 drop blocks 0-4): the same
// bits as keeping every position.
TEST_F(Gemma3BatchInvariance, RealModelQ8FreeingSlidingBlocksVsKeepingThem) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  const ScopedActivationPrecision precision(ActivationPrecision::kQ8);
  expect_same_logits({600, 128, false, 1, false, false, false}, {600, 128, false, 1, false, false, true},
                     "600-token context, sliding blocks freed vs kept");
}

// f16 weights: the float GEMM multiplies exact f32 activations in both modes,
// one fma chain per (row, token), so the default mode is batch-invariant
// without rounding anything.
TEST_F(F16BatchInvariance, RealModelPrefillChunkSizes) { prefill_chunk_sizes(ActivationPrecision::kQ8); }
TEST_F(F16BatchInvariance, RealModelVerificationPassVsOneAtATime) { verification_pass(ActivationPrecision::kQ8); }
TEST_F(F16BatchInvariance, RealModelOneVsTwoThreads) { one_vs_two_threads(ActivationPrecision::kQ8); }
TEST_F(F16BatchInvariance, RealModelAloneVsBatchOf16) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  alone_vs_batch(ActivationPrecision::kQ8);
}

// Exact f32 activations: DISABLED_ because the f32-activation matmul kernels
// over quantized weights are not batch-invariant: their last bits depend on
// the number of tokens in the call (e.g. prefill in chunks of 7 differs at a
// 6-token chunk, ~2e-5 in the logits). The kQ8 tests above run the same
// attention and per-row ops and pass, so the difference is in those kernels
// (src/kernels/matmul*, outside #15's q8 scope). Enable these if the exact
// kernels get a fixed per-(row, token) reduction too. OneVsTwoThreads passes
// already.
TEST_F(BatchInvarianceModel, DISABLED_RealModelF32PrefillChunkSizes) { prefill_chunk_sizes(ActivationPrecision::kF32); }
TEST_F(BatchInvarianceModel, DISABLED_RealModelF32VerificationPassVsOneAtATime) {
  verification_pass(ActivationPrecision::kF32);
}
TEST_F(BatchInvarianceModel, RealModelF32OneVsTwoThreads) { one_vs_two_threads(ActivationPrecision::kF32); }
TEST_F(BatchInvarianceModel, DISABLED_RealModelF32AloneVsBatchOf16) { alone_vs_batch(ActivationPrecision::kF32); }
TEST_F(BatchInvarianceModel, DISABLED_RealModelF32LongContextAloneVsBatch) {
  if (test_util::skip_slow()) GTEST_SKIP() << "slow without optimization";
  long_context_alone_vs_batch(ActivationPrecision::kF32);
}

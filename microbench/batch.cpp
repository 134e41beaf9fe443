// The batched forward pass (Transformer::forward_batch over the paged KV
// cache) on a real model: prompt processing of one long chunk and token
// generation of many sequences one token each per step, the two shapes a
// continuous-batching step mixes.
//   ./build/microbench_batch [-m MODEL] [-p 256] [-b 16] [-c 64] [-n 16] [-r 3] [--kv-type f32]
// pp: -p tokens of one sequence in one step; tg: -b sequences with -c tokens
// of context each, -n steps of one token per sequence. Best of -r runs.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_planner.h"
#include "kv/paged_kv_storage.h"
#include "model/model.h"
#include "model/transformer.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = "models/smollm2-135m-instruct-q4_1.gguf";
  int64_t prompt = 256, batch = 16, context = 64, steps = 16, reps = 3;
  KVType kv_type = KVType::F32;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "-m") o.model = value;
    else if (flag == "-p") o.prompt = std::stoll(value);
    else if (flag == "-b") o.batch = std::stoll(value);
    else if (flag == "-c") o.context = std::stoll(value);
    else if (flag == "-n") o.steps = std::stoll(value);
    else if (flag == "-r") o.reps = std::stoll(value);
    else if (flag == "--kv-type") o.kv_type = parse_kv_type(value, "--kv-type");
    else throw Error("microbench_batch: unknown flag " + flag);
  }
  return o;
}

// One step over `seqs` sequences: each runs `tokens[i]` at its current length.
struct Batch {
  Batch(const Model& m, int64_t n_blocks, const Options& o)
      : kv(n_blocks, 16, false),
        storage(m.config().n_layers, n_blocks, 16, m.config().n_kv_heads, m.config().head_dim, o.kv_type),
        transformer(m, AttentionKernel::kFlash),
        logits(static_cast<size_t>(o.batch * m.config().vocab_size)) {}
  void step(const std::vector<std::vector<int32_t>>& tokens, std::vector<int64_t>& lengths) {
    std::vector<SequenceChunk> chunks;
    std::vector<BlockCopy> copies;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto n = static_cast<int64_t>(tokens[i].size());
      check(kv.allocate(i, lengths[i], lengths[i] + n, copies), "the bench pool is large enough");
      chunks.push_back({tokens[i], lengths[i], kv.blocks(i), true});
      lengths[i] += n;
    }
    transformer.forward_batch(chunks, storage, logits.data());
  }
  KVCacheManager kv;
  PagedKVStorage storage;
  Transformer transformer;
  std::vector<float> logits;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double pp_seconds(const Model& m, const Options& o) {
  Batch b(m, (o.prompt + 15) / 16 + 1, o);
  std::vector<std::vector<int32_t>> tokens(1);
  for (int64_t i = 0; i < o.prompt; ++i) tokens[0].push_back(static_cast<int32_t>((i * 37 + 11) % m.config().vocab_size));
  std::vector<int64_t> lengths(1, 0);
  const auto t0 = Clock::now();
  b.step(tokens, lengths);
  return seconds_since(t0);
}

double tg_seconds(const Model& m, const Options& o) {
  const int64_t per_seq = (o.context + o.steps + 15) / 16;
  Batch b(m, o.batch * per_seq, o);
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(o.batch));
  for (size_t s = 0; s < tokens.size(); ++s)
    for (int64_t i = 0; i < o.context; ++i)
      tokens[s].push_back(static_cast<int32_t>((i * 13 + static_cast<int64_t>(s) * 7 + 3) % m.config().vocab_size));
  std::vector<int64_t> lengths(tokens.size(), 0);
  b.step(tokens, lengths);  // the context, not timed
  for (auto& t : tokens) t.resize(1);
  const auto t0 = Clock::now();
  for (int64_t step = 0; step < o.steps; ++step) b.step(tokens, lengths);
  return seconds_since(t0);
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  using namespace kvserve;
  try {
    const Options o = parse(argc, argv);
    auto model = Model::load(o.model);
    double pp = 1e30, tg = 1e30;
    for (int64_t r = 0; r < o.reps; ++r) {
      pp = std::min(pp, pp_seconds(*model, o));
      tg = std::min(tg, tg_seconds(*model, o));
    }
    std::printf("threads %d | kv %s | pp%lld: %.1f tok/s | tg (%lld seqs x %lld steps, ctx %lld): %.1f tok/s\n",
                omp_get_max_threads(), kv_type_info(o.kv_type).name, static_cast<long long>(o.prompt),
                static_cast<double>(o.prompt) / pp, static_cast<long long>(o.batch), static_cast<long long>(o.steps),
                static_cast<long long>(o.context), static_cast<double>(o.batch * o.steps) / tg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "microbench_batch: %s\n", e.what());
    return 1;
  }
  return 0;
}

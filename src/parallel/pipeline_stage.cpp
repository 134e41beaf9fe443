#include "parallel/pipeline_stage.h"

#include <exception>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline_messages.h"

namespace kvserve {
namespace {

// One non-zero rank's stage: its layers' K/V and the step it executes.
class PipelineStage {
 public:
  PipelineStage(const Model& stage, Communicator& comm, const PipelineSetup& setup, std::chrono::milliseconds timeout)
      : comm_(comm),
        last_(comm.rank() == comm.size() - 1),
        vocab_(stage.config().vocab_size),
        limits_{stage.config().dim, setup.n_blocks, setup.block_size},
        timeout_(timeout),
        storage_(stage.config().n_layers, setup.n_blocks, setup.block_size, stage.config().n_kv_heads,
                 stage.config().head_dim, static_cast<KVType>(setup.kv_type), stage.config().is_mla()),
        transformer_(stage, AttentionKernel::kFlash) {}

  // Runs one step message; false after the shutdown (passed down the chain).
  // A malformed message or a failed step fails that step on rank 0 with the
  // reason (later ranks never see it); the stage goes on with the next.
  bool execute(std::span<const std::byte> bytes, PipelineStageStats& stats) {
    StepMessage m;
    try {
      m = decode_step(bytes, limits_);
    } catch (const Error& e) {
      comm_.send(0, kPipelineReplyTag, encode_error_reply(e.what()), timeout_);
      return true;
    }
    if (m.shutdown) {
      if (!last_) comm_.send(comm_.rank() + 1, kPipelineStepTag, encode_shutdown(), timeout_);
      return false;
    }
    try {
      for (const BlockCopy& c : m.copies) storage_.copy_block(c.src, c.dst);
      run_layers(m, m.sequence_chunks(tokens_));
    } catch (const std::exception& e) {  // kvserve::Error, or bad_alloc for a step too large for this rank
      comm_.send(0, kPipelineReplyTag, encode_error_reply(e.what()), timeout_);
      return true;
    }
    comm_.send(last_ ? 0 : comm_.rank() + 1, last_ ? kPipelineReplyTag : kPipelineStepTag, message_, timeout_);
    stats.steps++;
    stats.tokens += m.n_tokens();
    return true;
  }

 private:
  // This rank's layers over the message's activations, into message_: the
  // next stage's step, or (the last rank) the logits reply.
  void run_layers(const StepMessage& m, std::span<const SequenceChunk> chunks) {
    if (last_) {
      int64_t rows = 0, floats = 0;
      for (const ChunkPlan& c : m.chunks) rows += c.logits_rows;  // each at most its chunk's tokens
      if (__builtin_mul_overflow(rows, vocab_, &floats))
        throw Error("pipeline: " + std::to_string(rows) + " logits rows of " + std::to_string(vocab_) + " are too many");
      logits_.resize(static_cast<size_t>(floats));
      transformer_.forward_stage(chunks, storage_, m.activations.data(), nullptr, logits_.data());
      return encode_logits_reply(logits_, message_);
    }
    activations_.resize(m.activations.size());
    transformer_.forward_stage(chunks, storage_, m.activations.data(), activations_.data(), nullptr);
    encode_step(m.copies, chunks, activations_, message_);
  }

  Communicator& comm_;
  bool last_;
  int64_t vocab_;
  StepLimits limits_;  // what a step message may name
  std::chrono::milliseconds timeout_;
  PagedKVStorage storage_;  // K/V of this rank's layers, block ids as rank 0's pool
  Transformer transformer_;
  std::vector<int32_t> tokens_;      // [n] placeholders: later stages never read token ids
  std::vector<float> activations_;   // [n][dim] after this rank's layers
  std::vector<float> logits_;        // [rows][vocab] the last rank's output
  std::vector<std::byte> message_;   // what this rank sends for the step
};

}  // namespace

namespace {

// The setup of an engine on rank 0, checked against this rank's stage; tells
// rank 0 why not and throws when it does not match.
void check_setup(const PipelineSetup& setup, const Model& stage, Communicator& comm, std::chrono::milliseconds timeout) {
  const KVPoolShape pool{setup.n_blocks, setup.block_size, static_cast<KVType>(setup.kv_type)};
  const std::string differences = setup_differences(setup, pipeline_setup(stage, comm.size(), pool));
  if (differences.empty()) return;
  const std::string error = "its model or settings differ from rank 0's (" + differences +
                            ", rank 0's first): give every rank the same file and flags";
  comm.send(0, kPipelineReplyTag, encode_error_reply(error), timeout);
  throw Error("pipeline rank " + std::to_string(comm.rank()) + ": " + error);
}

}  // namespace

PipelineStageStats run_pipeline_stage(const Model& stage, Communicator& comm, std::chrono::milliseconds timeout) {
  if (comm.rank() == 0) throw Error("rank 0 of a pipeline runs the engine, not a later stage");
  PipelineStageStats stats;
  std::vector<std::byte> bytes;
  for (;;) {
    comm.broadcast(0, bytes, Communicator::kForever);  // the next engine's setup, or the end
    if (bytes.empty()) return stats;
    const PipelineSetup setup = PipelineSetup::decode(bytes);
    check_setup(setup, stage, comm, timeout);
    PipelineStage runner(stage, comm, setup, timeout);
    std::vector<std::byte> ready;
    encode_logits_reply({}, ready);
    comm.send(0, kPipelineReplyTag, ready, timeout);
    do {
      comm.recv(comm.rank() - 1, kPipelineStepTag, bytes, Communicator::kForever);
    } while (runner.execute(bytes, stats));
  }
}

void end_pipeline(Communicator& comm, std::chrono::milliseconds timeout) {
  std::vector<std::byte> end;  // empty: no setup follows
  comm.broadcast(0, end, timeout);
}

}  // namespace kvserve

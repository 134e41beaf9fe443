#pragma once
// Messages between the ranks of a pipeline (docs/scaling.md): the one
// interface the pipeline code talks through, so that MPI
// (mpi_communicator.h) serves CPU hosts today and NCCL can serve a GPU build
// later. A message is a byte string whose size the receiver learns when it
// arrives; messages from one rank under one tag arrive in the order sent.
// Every wait has a timeout: a rank that is down, stopped or unreachable
// becomes a kvserve::Error naming it, never a hang. Not thread-safe: one
// thread at a time per communicator.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvserve {

class Communicator {
 public:
  static constexpr int kAnyRank = -1;
  // A timeout that never expires (a stage waiting for the next step of an idle server).
  static constexpr std::chrono::milliseconds kForever{-1};

  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sends `bytes` to rank `to` under `tag`; returns once the buffer may be
  // reused. Throws kvserve::Error when the message cannot be handed over
  // within `timeout` or the transport fails.
  virtual void send(int to, int tag, std::span<const std::byte> bytes, std::chrono::milliseconds timeout) = 0;
  // Receives the next message under `tag` from rank `from` (or kAnyRank) into
  // `bytes` (resized to fit); returns the sender. Throws kvserve::Error when
  // none arrives within `timeout` or the transport fails.
  virtual int recv(int from, int tag, std::vector<std::byte>& bytes, std::chrono::milliseconds timeout) = 0;
  // Rank `root`'s `bytes` to every rank (the others' resized to fit); every
  // rank calls it. Throws like recv.
  virtual void broadcast(int root, std::vector<std::byte>& bytes, std::chrono::milliseconds timeout) = 0;

  // Payload bytes this rank has sent (send, and broadcast as the root counts
  // one copy per other rank): the communication volume of docs/scaling.md.
  uint64_t bytes_sent() const { return bytes_sent_; }

 protected:
  void count_sent(uint64_t bytes) { bytes_sent_ += bytes; }

 private:
  uint64_t bytes_sent_ = 0;
};

}  // namespace kvserve

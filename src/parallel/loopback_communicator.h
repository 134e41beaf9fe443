#pragma once
// In-process ranks (tests, and pipelines in one process without MPI): a
// group of n communicators whose messages go through shared mailboxes. Each
// rank's communicator is used by one thread at a time (its rank's); sends
// never block, receives wait on the mailbox with their timeout.
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace kvserve {

class LoopbackGroup {
 public:
  explicit LoopbackGroup(int n);
  ~LoopbackGroup();
  LoopbackGroup(const LoopbackGroup&) = delete;
  LoopbackGroup& operator=(const LoopbackGroup&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  Communicator& rank(int r);

  struct Mailbox;

 private:
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;  // [n] one per receiving rank
  std::vector<std::unique_ptr<Communicator>> ranks_;
};

}  // namespace kvserve

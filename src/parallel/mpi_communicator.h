#pragma once
// The Communicator over MPI (Open MPI 4.1 from Debian; built with
// -DKVSERVE_MPI=ON). Owns MPI's lifetime: MPI_Init_thread at construction
// (serialized: the engine thread talks to the other ranks after the main
// thread set up) and MPI_Finalize at destruction, or MPI_Abort after a
// failure (a lost rank would make MPI_Finalize wait for ever). Errors come
// back as codes (MPI_ERRORS_RETURN) and every wait polls with a deadline,
// backing off to 1 ms sleeps so that an idle rank leaves the cores to the
// ones computing.
#include <memory>

#include "parallel/communicator.h"

namespace kvserve {

// Whether this process was started by mpirun / mpiexec (Open MPI's environment).
bool started_by_mpirun();

class MpiCommunicator : public Communicator {
 public:
  // Throws kvserve::Error when MPI cannot start or lacks the thread support.
  MpiCommunicator();
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int to, int tag, std::span<const std::byte> bytes, std::chrono::milliseconds timeout) override;
  int recv(int from, int tag, std::vector<std::byte>& bytes, std::chrono::milliseconds timeout) override;
  void broadcast(int root, std::vector<std::byte>& bytes, std::chrono::milliseconds timeout) override;

  // Ends every rank of the job now (MPI_Abort) with this exit code.
  [[noreturn]] void abort(int code);

 private:
  int rank_ = 0;
  int size_ = 1;
  bool failed_ = false;  // a call failed or timed out: the destructor aborts instead of finalizing
};

}  // namespace kvserve

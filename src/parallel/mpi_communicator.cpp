#include "parallel/mpi_communicator.h"

#include <mpi.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <thread>

#include "core/error.h"

namespace kvserve {
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

std::string peer_name(int rank) { return rank == Communicator::kAnyRank ? "any rank" : "rank " + std::to_string(rank); }

// Polls `done` until it is true or `timeout` passes (negative: never): spins
// a little, then sleeps up to 1 ms between polls. False on timeout.
template <typename Done>
bool poll_until(Done done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(0);
  for (int polls = 0;; ++polls) {
    if (done()) return true;
    if (timeout >= std::chrono::milliseconds::zero() && std::chrono::steady_clock::now() >= deadline) return false;
    if (polls < 1000) continue;
    pause = std::min(std::chrono::microseconds(1000), pause + std::chrono::microseconds(20));
    std::this_thread::sleep_for(pause);
  }
}

}  // namespace

bool started_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr; }

MpiCommunicator::MpiCommunicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) throw Error("MPI is already initialized in this process");
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    throw Error("MPI_Init_thread failed: is this process started by mpirun?");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    throw Error("this MPI library does not allow MPI calls from more than one thread (MPI_THREAD_SERIALIZED)");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  if (failed_) abort(1);
  MPI_Finalize();
}

void MpiCommunicator::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] true whatever the library does
}

void MpiCommunicator::send(int to, int tag, std::span<const std::byte> bytes, std::chrono::milliseconds timeout) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()))  // MPI counts are ints
    throw Error("pipeline: a message of " + std::to_string(bytes.size()) + " bytes is over MPI's 2 GiB limit: "
                "lower --max-running or the batch size");
  MPI_Request request;
  int rc = MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, to, tag, MPI_COMM_WORLD, &request);
  int done = 0;
  const bool in_time = rc == MPI_SUCCESS && poll_until([&] {
    rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    return rc != MPI_SUCCESS || done != 0;
  }, timeout);
  if (rc != MPI_SUCCESS) {
    failed_ = true;
    throw Error("pipeline: rank " + std::to_string(rank_) + " could not send to rank " + std::to_string(to) + ": " +
                mpi_error_text(rc));
  }
  if (!in_time) {
    failed_ = true;
    throw Error("pipeline: rank " + std::to_string(to) + " did not take a message from rank " + std::to_string(rank_) +
                " within " + std::to_string(timeout.count()) + " ms: it is down, stopped or unreachable");
  }
  count_sent(bytes.size());
}

int MpiCommunicator::recv(int from, int tag, std::vector<std::byte>& bytes, std::chrono::milliseconds timeout) {
  const int source = from == kAnyRank ? MPI_ANY_SOURCE : from;
  MPI_Status status;
  int found = 0;
  int rc = MPI_SUCCESS;
  const bool in_time = poll_until([&] {
    rc = MPI_Iprobe(source, tag, MPI_COMM_WORLD, &found, &status);
    return rc != MPI_SUCCESS || found != 0;
  }, timeout);
  if (rc == MPI_SUCCESS && !in_time) {
    failed_ = true;
    throw Error("pipeline: rank " + std::to_string(rank_) + " received nothing from " + peer_name(from) + " within " +
                std::to_string(timeout.count()) + " ms: it is down, stopped, unreachable or slower than --pipeline-timeout");
  }
  int count = 0;
  if (rc == MPI_SUCCESS) rc = MPI_Get_count(&status, MPI_BYTE, &count);
  if (rc == MPI_SUCCESS) {
    bytes.resize(static_cast<size_t>(count));
    rc = MPI_Recv(bytes.data(), count, MPI_BYTE, status.MPI_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  if (rc != MPI_SUCCESS) {
    failed_ = true;
    throw Error("pipeline: rank " + std::to_string(rank_) + " could not receive from " + peer_name(from) + ": " +
                mpi_error_text(rc));
  }
  return status.MPI_SOURCE;
}

void MpiCommunicator::broadcast(int root, std::vector<std::byte>& bytes, std::chrono::milliseconds timeout) {
  // Size first (the others learn it), then the bytes: two non-blocking collectives, each polled.
  const auto collective = [&](void* data, int count, const char* what) {
    MPI_Request request;
    int rc = MPI_Ibcast(data, count, MPI_BYTE, root, MPI_COMM_WORLD, &request);
    int done = 0;
    const bool in_time = rc == MPI_SUCCESS && poll_until([&] {
      rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      return rc != MPI_SUCCESS || done != 0;
    }, timeout);
    if (rc == MPI_SUCCESS && in_time) return;
    failed_ = true;
    throw Error("pipeline: the broadcast of the " + std::string(what) + " from rank " + std::to_string(root) +
                (rc != MPI_SUCCESS ? " failed: " + mpi_error_text(rc)
                                   : " did not complete within " + std::to_string(timeout.count()) + " ms"));
  };
  auto size = static_cast<int64_t>(bytes.size());
  collective(&size, sizeof size, "message size");
  bytes.resize(static_cast<size_t>(size));
  collective(bytes.data(), static_cast<int>(size), "message");
  if (rank_ == root) count_sent(static_cast<uint64_t>(size) * static_cast<uint64_t>(size_ - 1));
}

}  // namespace kvserve

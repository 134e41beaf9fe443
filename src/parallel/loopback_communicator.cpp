#include "parallel/loopback_communicator.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>

#include "core/error.h"

namespace kvserve {

struct LoopbackGroup::Mailbox {
  struct Message {
    int from;
    int tag;
    std::vector<std::byte> bytes;
  };
  std::mutex mutex;
  std::condition_variable arrived;
  std::deque<Message> messages;  // in arrival order
};

namespace {

constexpr int kBroadcastTag = -1000;  // below every tag the pipeline uses

class LoopbackCommunicator : public Communicator {
 public:
  LoopbackCommunicator(int rank, std::vector<std::unique_ptr<LoopbackGroup::Mailbox>>& mailboxes)
      : rank_(rank), mailboxes_(mailboxes) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(mailboxes_.size()); }

  void send(int to, int tag, std::span<const std::byte> bytes, std::chrono::milliseconds) override {
    check(to >= 0 && to < size() && to != rank_, "a loopback message goes to another rank of the group");
    LoopbackGroup::Mailbox& box = *mailboxes_[static_cast<size_t>(to)];
    count_sent(bytes.size());  // before the message is visible: a receiver that reads the count after it sees it
    {
      std::lock_guard lock(box.mutex);
      box.messages.push_back({rank_, tag, std::vector<std::byte>(bytes.begin(), bytes.end())});
    }
    box.arrived.notify_all();
  }

  int recv(int from, int tag, std::vector<std::byte>& bytes, std::chrono::milliseconds timeout) override {
    LoopbackGroup::Mailbox& box = *mailboxes_[static_cast<size_t>(rank_)];
    std::unique_lock lock(box.mutex);
    const auto match = [&] {
      for (auto it = box.messages.begin(); it != box.messages.end(); ++it)
        if (it->tag == tag && (from == kAnyRank || it->from == from)) return it;
      return box.messages.end();
    };
    auto it = match();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (it == box.messages.end()) {
      if (timeout < std::chrono::milliseconds::zero()) box.arrived.wait(lock);
      else if (box.arrived.wait_until(lock, deadline) == std::cv_status::timeout && (it = match()) == box.messages.end())
        throw Error("pipeline: rank " + std::to_string(rank_) + " received nothing from " +
                    (from == kAnyRank ? std::string("any rank") : "rank " + std::to_string(from)) + " within " +
                    std::to_string(timeout.count()) + " ms");
      it = match();
    }
    const int sender = it->from;
    bytes = std::move(it->bytes);
    box.messages.erase(it);
    return sender;
  }

  void broadcast(int root, std::vector<std::byte>& bytes, std::chrono::milliseconds timeout) override {
    if (rank_ != root) {
      recv(root, kBroadcastTag, bytes, timeout);
      return;
    }
    for (int r = 0; r < size(); ++r)
      if (r != root) send(r, kBroadcastTag, bytes, timeout);
  }

 private:
  int rank_;
  std::vector<std::unique_ptr<LoopbackGroup::Mailbox>>& mailboxes_;
};

}  // namespace

LoopbackGroup::LoopbackGroup(int n) {
  if (n < 1) throw Error("a loopback group needs at least one rank, got " + std::to_string(n));
  for (int r = 0; r < n; ++r) mailboxes_.push_back(std::make_unique<Mailbox>());
  for (int r = 0; r < n; ++r) ranks_.push_back(std::make_unique<LoopbackCommunicator>(r, mailboxes_));
}

LoopbackGroup::~LoopbackGroup() = default;

Communicator& LoopbackGroup::rank(int r) {
  check(r >= 0 && r < size(), "a rank of the loopback group");
  return *ranks_[static_cast<size_t>(r)];
}

}  // namespace kvserve

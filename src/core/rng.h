#pragma once
// Seeded pseudo-random generator: xoshiro256** with its state expanded from
// one 64-bit seed by splitmix64. Each user owns one (a sampler, the weight
// synthesizer), so draws depend only on the seed (no global state, no
// std::random_device) and replay identically.
#include <cstdint>

namespace kvserve {

// One step of splitmix64: advances `state` and returns a well-mixed value.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    // splitmix64 spreads any seed (0 included) over the whole state; xoshiro
    // must never start from the all-zero state, which splitmix64 cannot yield
    // for four consecutive outputs.
    uint64_t x = seed;
    for (uint64_t& word : state_) word = splitmix64(x);
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits (every double of the form k / 2^53).
  double next_uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t state_[4];
};

}  // namespace kvserve

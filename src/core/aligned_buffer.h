#pragma once
// Owning, 64-byte-aligned, zero-initialized array (cache-line and AVX-512 aligned).
// Buffers of 1 MiB and more are fresh anonymous mappings: the kernel hands out
// zero pages as they are first touched, so a large pool (the paged KV cache,
// sized for every running sequence's whole context) costs resident memory
// only for what is used, instead of a memset that made all of it resident.
#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace kvserve {

template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) { resize(n); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)),
        mapped_bytes_(std::exchange(o.mapped_bytes_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      mapped_bytes_ = std::exchange(o.mapped_bytes_, 0);
    }
    return *this;
  }
  ~AlignedBuffer() { release(); }

  // Discards the contents; the new buffer is zeroed.
  void resize(size_t n) {
    release();
    size_ = n;
    if (n == 0) return;
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    if (bytes >= kMapBytes) {
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      ::madvise(p, bytes, MADV_HUGEPAGE);
      data_ = static_cast<T*>(p);
      mapped_bytes_ = bytes;
      return;
    }
    data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!data_) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_), 0, bytes);
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  static constexpr size_t kMapBytes = size_t{1} << 20;

  void release() {
    if (mapped_bytes_ > 0) ::munmap(static_cast<void*>(data_), mapped_bytes_);
    else std::free(data_);
    data_ = nullptr;
    size_ = 0;
    mapped_bytes_ = 0;
  }

  T* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_bytes_ = 0;  // > 0: data_ is an anonymous mapping of this size
};

}  // namespace kvserve

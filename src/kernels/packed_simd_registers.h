#pragma once
// Internal, for packed_simd.h: the vector registers its kernel templates are
// written against. Ymm holds one 8-row group per 256-bit register, Zmm two
// adjacent groups per 512-bit register; each comes with the same set of
// integer and float operations (and_, maddubs, madd, dpbusd, fmadd...), so one
// template body compiles for either width. Every function is static: the
// including translation unit (matmul_packed_avx2.cpp, _avx512.cpp) picks the
// instruction set.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "core/dtype.h"

namespace kvserve {
namespace packed_simd {
#ifdef __AVX512VNNI__
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

// kIQ4NLValues + 128 as bytes: the levels as vpdpbusd's unsigned operand.
struct BiasedLevels {
  alignas(16) uint8_t v[16];
};
constexpr BiasedLevels biased_levels() {
  BiasedLevels b{};
  for (int i = 0; i < 16; ++i) b.v[i] = static_cast<uint8_t>(kIQ4NLValues[i] + 128);
  return b;
}
inline constexpr BiasedLevels kIQ4NLBiased = biased_levels();

template <typename F, int... I>
static inline void unroll_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
// f(0), f(1), ..., f(N - 1) with compile-time indices.
template <int N, typename F>
static inline void unroll(F&& f) {
  unroll_impl(f, std::make_integer_sequence<int, N>{});
}

static inline __m128i load64(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }
static inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
static inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
static inline int32_t four_bytes(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The same offset in the one or two row groups a register covers: p in the
// first, p + stride in the second.
struct Rows {
  const uint8_t* p;
  size_t stride;
  Rows operator+(size_t offset) const { return {p + offset, stride}; }
};

// One 8-row group per register.
struct Ymm {
  using I = __m256i;
  using F = __m256;
  static constexpr int kRows = 8;
  static I load(Rows r) { return load256(r.p); }
  static I zero() { return _mm256_setzero_si256(); }
  static I set8(char v) { return _mm256_set1_epi8(v); }
  static I set16(short v) { return _mm256_set1_epi16(v); }
  static I set32(int v) { return _mm256_set1_epi32(v); }
  static I broadcast4(const int8_t* p) { return _mm256_set1_epi32(four_bytes(p)); }
  // The 16 IQ4 levels in every 128-bit lane (shuffle_epi8's table).
  static I levels() { return _mm256_broadcastsi128_si256(load128(reinterpret_cast<const uint8_t*>(kIQ4NLValues))); }
  static I biased_levels() { return _mm256_broadcastsi128_si256(load128(kIQ4NLBiased.v)); }
  // Lane r = byte r of the 8 at r.p (per group), widened.
  static I u8_lanes(Rows r) { return _mm256_cvtepu8_epi32(load64(r.p)); }
  static I i8_lanes(Rows r) { return _mm256_cvtepi8_epi32(load64(r.p)); }
  // Lane r = (f(a)_r, f(b)_r) as two s16, f applied to each group's 8 bytes.
  template <typename Fn>
  static I u8_pairs(Rows a, Rows b, Fn f) { return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(f(load64(a.p)), f(load64(b.p)))); }
  static I i8_pairs(Rows a, Rows b) { return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(load64(a.p), load64(b.p))); }
  static F f16(Rows r) { return _mm256_cvtph_ps(load128(r.p)); }
  static F fzero() { return _mm256_setzero_ps(); }
  static F fset(float v) { return _mm256_set1_ps(v); }
  static void store(float* out, F v) { _mm256_storeu_ps(out, v); }
};

static inline __m256i and_(__m256i a, __m256i b) { return _mm256_and_si256(a, b); }
static inline __m256i or_(__m256i a, __m256i b) { return _mm256_or_si256(a, b); }
static inline __m256i add16(__m256i a, __m256i b) { return _mm256_add_epi16(a, b); }
static inline __m256i add32(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
static inline __m256i sub32(__m256i a, __m256i b) { return _mm256_sub_epi32(a, b); }
static inline __m256i maddubs(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }
static inline __m256i xor_(__m256i a, __m256i b) { return _mm256_xor_si256(a, b); }
static inline __m256i mullo32(__m256i a, __m256i b) { return _mm256_mullo_epi32(a, b); }
#ifdef __AVX512VNNI__
static inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#endif
static inline __m256i madd(__m256i a, __m256i b) { return _mm256_madd_epi16(a, b); }
static inline __m256i abs8(__m256i a) { return _mm256_abs_epi8(a); }
static inline __m256i lookup(__m256i table, __m256i idx) { return _mm256_shuffle_epi8(table, idx); }
// x with the signs of w (x where w > 0, -x where w < 0; x where w == 0 does
// not matter: it meets |w| = 0).
static inline __m256i sign_of(__m256i x, __m256i w) { return _mm256_sign_epi8(x, w); }
template <int k> static inline __m256i shl16(__m256i a) { return _mm256_slli_epi16(a, k); }
template <int k> static inline __m256i shr16(__m256i a) { return _mm256_srli_epi16(a, k); }
template <int k> static inline __m256i shl32(__m256i a) { return _mm256_slli_epi32(a, k); }
// Every 32-bit lane shifted left by the count in the low 64 bits of `count`.
static inline __m256i shl32_by(__m256i a, __m128i count) { return _mm256_sll_epi32(a, count); }
// Every 32-bit lane shifted left by *count: with AVX-512 one vpsllvd that
// broadcasts the count from memory (from the intrinsics GCC emits a separate
// load; the 32-value blocks take two such shifts per token and block).
static inline __m256i shl32_by(__m256i a, const int32_t* count) {
#ifdef __AVX512VL__
  __m256i r;
  __asm__("vpsllvd %2%{1to8%}, %1, %0" : "=v"(r) : "v"(a), "m"(*count));
  return r;
#else
  return _mm256_sll_epi32(a, _mm_cvtsi32_si128(*count));
#endif
}
static inline __m256 to_float(__m256i a) { return _mm256_cvtepi32_ps(a); }
static inline __m256 fmadd(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
static inline __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
// Pins v to a register at this point. GCC otherwise computes all of a
// sub-block's maddubs first and sums them later, spilling the products (16
// registers); this keeps each token's s16 sum a running chain.
static inline void pin(__m256i& v) { __asm__("" : "+x"(v)); }

#ifdef __AVX512BW__
// Two adjacent 8-row groups per register: the low 256 bits are the first
// group, laid out as in Ymm. On a CPU that splits 512-bit operations in two
// (Zen 4) this halves the instructions per multiply, not the multiplies.
struct Zmm {
  using I = __m512i;
  using F = __m512;
  static constexpr int kRows = 16;
  static __m256i join(__m128i lo, __m128i hi) { return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1); }
  static I load(Rows r) { return _mm512_inserti64x4(_mm512_castsi256_si512(load256(r.p)), load256(r.p + r.stride), 1); }
  static I zero() { return _mm512_setzero_si512(); }
  static I set8(char v) { return _mm512_set1_epi8(v); }
  static I set16(short v) { return _mm512_set1_epi16(v); }
  static I set32(int v) { return _mm512_set1_epi32(v); }
  static I broadcast4(const int8_t* p) { return _mm512_set1_epi32(four_bytes(p)); }
  static I levels() { return _mm512_broadcast_i32x4(load128(reinterpret_cast<const uint8_t*>(kIQ4NLValues))); }
  static I biased_levels() { return _mm512_broadcast_i32x4(load128(kIQ4NLBiased.v)); }
  static __m128i bytes8x2(Rows r) { return _mm_unpacklo_epi64(load64(r.p), load64(r.p + r.stride)); }
  static I u8_lanes(Rows r) { return _mm512_cvtepu8_epi32(bytes8x2(r)); }
  static I i8_lanes(Rows r) { return _mm512_cvtepi8_epi32(bytes8x2(r)); }
  template <typename Fn>
  static I u8_pairs(Rows a, Rows b, Fn f) {
    return _mm512_cvtepu8_epi16(join(_mm_unpacklo_epi8(f(load64(a.p)), f(load64(b.p))),
                                     _mm_unpacklo_epi8(f(load64(a.p + a.stride)), f(load64(b.p + b.stride)))));
  }
  static I i8_pairs(Rows a, Rows b) {
    return _mm512_cvtepi8_epi16(join(_mm_unpacklo_epi8(load64(a.p), load64(b.p)),
                                     _mm_unpacklo_epi8(load64(a.p + a.stride), load64(b.p + b.stride))));
  }
  static F f16(Rows r) { return _mm512_cvtph_ps(join(load128(r.p), load128(r.p + r.stride))); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F fset(float v) { return _mm512_set1_ps(v); }
  static void store(float* out, F v) { _mm512_storeu_ps(out, v); }
};

static inline __m512i and_(__m512i a, __m512i b) { return _mm512_and_si512(a, b); }
static inline __m512i or_(__m512i a, __m512i b) { return _mm512_or_si512(a, b); }
static inline __m512i add16(__m512i a, __m512i b) { return _mm512_add_epi16(a, b); }
static inline __m512i add32(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
static inline __m512i sub32(__m512i a, __m512i b) { return _mm512_sub_epi32(a, b); }
static inline __m512i maddubs(__m512i u, __m512i s) { return _mm512_maddubs_epi16(u, s); }
static inline __m512i xor_(__m512i a, __m512i b) { return _mm512_xor_si512(a, b); }
static inline __m512i mullo32(__m512i a, __m512i b) { return _mm512_mullo_epi32(a, b); }
#ifdef __AVX512VNNI__
static inline __m512i dpbusd(__m512i acc, __m512i u, __m512i s) { return _mm512_dpbusd_epi32(acc, u, s); }
#endif
static inline __m512i madd(__m512i a, __m512i b) { return _mm512_madd_epi16(a, b); }
static inline __m512i abs8(__m512i a) { return _mm512_abs_epi8(a); }
static inline __m512i lookup(__m512i table, __m512i idx) { return _mm512_shuffle_epi8(table, idx); }
// No 512-bit sign_epi8: negate x where w's sign bit is set.
static inline __m512i sign_of(__m512i x, __m512i w) {
  return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
}
template <int k> static inline __m512i shl16(__m512i a) { return _mm512_slli_epi16(a, k); }
template <int k> static inline __m512i shr16(__m512i a) { return _mm512_srli_epi16(a, k); }
template <int k> static inline __m512i shl32(__m512i a) { return _mm512_slli_epi32(a, k); }
static inline __m512i shl32_by(__m512i a, __m128i count) { return _mm512_sll_epi32(a, count); }
static inline __m512i shl32_by(__m512i a, const int32_t* count) {
  __m512i r;
  __asm__("vpsllvd %2%{1to16%}, %1, %0" : "=v"(r) : "v"(a), "m"(*count));
  return r;
}
static inline __m512 to_float(__m512i a) { return _mm512_cvtepi32_ps(a); }
static inline __m512 fmadd(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
static inline __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
static inline void pin(__m512i& v) { __asm__("" : "+v"(v)); }
#endif

}  // namespace packed_simd
}  // namespace kvserve

// bf16 <-> float conversion with round-to-nearest-even, bit for bit what the
// GPU's cvt.rn.bf16.f32 does. The oracle, the host kernels and the runner all
// round through these so that "rounded to bf16" means one thing everywhere.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace ktune {

inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Rounds a double straight to bf16 (no detour through float, which could
// round twice): frexp's way, for any value.
inline uint16_t double_to_bf16_general(double d) {
  if (std::isnan(d)) return 0x7fc0;
  if (d == 0.0 || std::isinf(d)) return float_to_bf16(float(d));
  int e;
  double m = std::frexp(d, &e);                   // |m| in [0.5, 1)
  double r = std::nearbyint(std::ldexp(m, 8));    // 8 significant bits, ties to even
  return float_to_bf16(float(std::ldexp(r, e - 8)));  // exact: r has 8 bits
}

// The same rounding on a double's bits u, where the result is a normal bf16
// (the oracle rounds ~10^9 values an attempt; frexp's way took most of its
// time): the 52-bit fraction rounded to bf16's 7 bits, ties to even; a carry
// out of the fraction bumps the exponent, as it should. Branch-free, so
// that loops over it vectorize.
inline uint64_t bf16_rounded_bits(uint64_t u) {
  constexpr int kDropped = 52 - 7;
  return (u + (uint64_t(1) << (kDropped - 1)) - 1 + ((u >> kDropped) & 1)) & ~((uint64_t(1) << kDropped) - 1);
}
// Whether r is bf16's rounding of the double whose bits are u: its magnitude
// at least 2^-126 (the smallest normal), and r still below 2^128. (Not for
// zero, NaN or infinity: those take frexp's way.)
inline bool bf16_rounds_normal(uint64_t u, uint64_t r) {
  return ((u >> 52) & 0x7ff) - (1023 - 126) <= 253 && ((r >> 52) & 0x7ff) <= 1023 + 127;
}

inline uint16_t double_to_bf16(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  const uint64_t r = bf16_rounded_bits(u);
  if (!bf16_rounds_normal(u, r)) return double_to_bf16_general(d);
  double rounded;
  std::memcpy(&rounded, &r, 8);
  return float_to_bf16(float(rounded));  // exact: 8 significant bits, in float's range
}

inline double round_bf16(double d) { return bf16_to_float(double_to_bf16(d)); }
inline float round_bf16f(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace ktune

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
// round twice).
inline uint16_t double_to_bf16(double d) {
  if (std::isnan(d)) return 0x7fc0;
  if (d == 0.0 || std::isinf(d)) return float_to_bf16(float(d));
  int e;
  double m = std::frexp(d, &e);                   // |m| in [0.5, 1)
  double r = std::nearbyint(std::ldexp(m, 8));    // 8 significant bits, ties to even
  return float_to_bf16(float(std::ldexp(r, e - 8)));  // exact: r has 8 bits
}

inline double round_bf16(double d) { return bf16_to_float(double_to_bf16(d)); }
inline float round_bf16f(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace ktune

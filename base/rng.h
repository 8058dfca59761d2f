// Counter-based random numbers: value i of stream s is a pure function of
// (s, i), so big tensors are generated in parallel, in any order, and the
// same seed gives the same bits on every machine.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

namespace ktune {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A stream id from a seed and a name (FNV-1a of the name, mixed with the seed).
inline uint64_t stream_id(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return splitmix64(h ^ splitmix64(seed));
}

// Uniform in (0, 1), never 0 (safe for log).
inline double uniform01(uint64_t stream, uint64_t index) {
  uint64_t r = splitmix64(stream ^ splitmix64(index));
  return (double(r >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal (Box-Muller on two independent uniforms).
inline double normal(uint64_t stream, uint64_t index) {
  double u1 = uniform01(stream, 2 * index);
  double u2 = uniform01(stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// A small sequential generator for search decisions (seeded, reproducible).
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(splitmix64(seed)) {}
  uint64_t next() { state = splitmix64(state); return state; }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  double unit() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
};

}  // namespace ktune

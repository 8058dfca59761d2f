// KimiState: the recurrent state one decode step reads and updates (per K
// layer the KDA matrix S and the three conv windows; per M layer the latent
// cache), and its seeded generation per the spec ("pre-filled state for a
// seed"). Row t of a cache depends only on (seed, t), so a longer context
// extends a shorter one.
#pragma once
#include <cstdint>
#include <list>
#include <vector>

#include "kernels/kimi/config.h"

namespace ktune::kimi {

struct LayerState {
  std::vector<float> S;                 // K: fp32 [heads, head_dim (key), head_dim (value)]
  std::vector<uint16_t> cq, ck, cv;     // K: bf16 [3, C], oldest row first
  std::vector<uint16_t> c_kv, k_rope;   // M: bf16 [rows, kv_lora], [rows, qk_rope]
};

struct KimiState {
  std::vector<LayerState> layers;
  int context = 0;  // rows filled in each M layer's cache; the next token's position
};

// Caches get room for `capacity` rows (at least context + 1).
KimiState make_state(const KimiConfig& cfg, uint64_t seed, int context, int capacity = 0);
// One layer's part of make_state.
void make_layer_state(const KimiConfig& cfg, uint64_t seed, int layer, int context, int capacity, LayerState* L);
// The input token, bf16 [hidden] ~ N(0, 0.25^2).
std::vector<uint16_t> make_token(const KimiConfig& cfg, uint64_t seed);

// The states of a few seeds, each generated once at the longest context
// asked for: a shorter context's state is the longer one's with the cache
// rows past it zeroed, so a runner that steps one seed at several contexts
// (a validation's cases, a timing's contexts) copies instead of generating
// again. get() is make_state(cfg, seed, context, capacity), bit for bit.
class SeededStates {
 public:
  SeededStates(const KimiConfig& cfg, int capacity) : cfg_(cfg), capacity_(capacity) {}
  // `longest`: the longest context the caller will ask for with this seed
  // (generated now if the kept state is shorter, so later calls copy).
  KimiState get(uint64_t seed, int context, int longest = 0);

 private:
  // A validation's three seeds and the timing's one: the timing's state
  // outlives the validations between two timings.
  static constexpr size_t kKept = 4;
  struct Kept {
    uint64_t seed;
    KimiState state;
  };
  const KimiConfig& cfg_;
  int capacity_;
  std::list<Kept> kept_;  // most recently used first
};

}  // namespace ktune::kimi

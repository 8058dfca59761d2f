// KimiState: the recurrent state one decode step reads and updates (per K
// layer the KDA matrix S and the three conv windows; per M layer the latent
// cache), and its seeded generation per the spec ("pre-filled state for a
// seed"). Row t of a cache depends only on (seed, t), so a longer context
// extends a shorter one.
#pragma once
#include <cstdint>
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
// The input token, bf16 [hidden] ~ N(0, 0.25^2).
std::vector<uint16_t> make_token(const KimiConfig& cfg, uint64_t seed);

}  // namespace ktune::kimi

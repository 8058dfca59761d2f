// KimiWeights: the block's weights under the spec's state-dict names, bound
// to typed views per layer; their deterministic generation from a seed (the
// spec's recipe); and a cache, so a session (and its runner) generates them
// once per machine.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/tensor.h"
#include "kernels/kimi/config.h"

namespace ktune::kimi {

// One W4A16 matrix with input dim K and output dim N, or a stack of `count`
// of them (the experts). w_q is [K/2, N] bytes, low nibble = even row;
// scales and zeros are bf16 [K/group, N].
struct QLinear {
  const uint8_t* w_q = nullptr;
  const uint16_t* scales = nullptr;
  const uint16_t* zeros = nullptr;
  int K = 0, N = 0, count = 1, group = 128;

  QLinear expert(int e) const;
  size_t bytes() const;  // w_q + scales + zeros of one matrix
};

struct KdaWeights {
  QLinear q, k, v, g, o;
  const uint16_t* beta = nullptr;    // bf16 [heads, hidden]
  const uint16_t* conv_w = nullptr;  // bf16 [3, C, 4]
};

struct MlaWeights {
  QLinear q, kv_a, kv_b, o;
};

struct MoeWeights {
  const uint16_t* router = nullptr;  // bf16 [experts, hidden]
  QLinear gate, up, down;            // stacks of n_experts
  QLinear s_gate, s_up, s_down;      // stacks of n_shared
};

struct LayerWeights {
  const uint16_t* attn_norm = nullptr;
  const uint16_t* moe_norm = nullptr;
  KdaWeights kda;  // bound when the layer is K
  MlaWeights mla;  // bound when the layer is M
  MoeWeights moe;
};

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Every weight tensor of a config, in a fixed order.
std::vector<TensorSpec> weight_specs(const KimiConfig& cfg);

struct KimiWeights {
  KimiConfig cfg;
  TensorFile file;
  std::vector<LayerWeights> layers;

  // Checks every name and shape against weight_specs and fills `layers`.
  bool bind(std::string* err);
  // Bytes of all weight tensors.
  size_t total_bytes() const;
};

// Generates the weights for (cfg, seed) per the spec's recipe. Deterministic
// and parallel.
bool generate_weights(const KimiConfig& cfg, uint64_t seed, TensorFile* out, std::string* err);

// The cache file for (cfg, seed) under cache_dir().
std::string weights_cache_path(const KimiConfig& cfg, uint64_t seed);

// Loads (cfg, seed) from the cache, generating and caching it first if
// missing or stale. `generated` tells which happened.
bool load_weights(const KimiConfig& cfg, uint64_t seed, KimiWeights* out, std::string* err,
                  bool* generated = nullptr);

// Loads a safetensors file whose metadata holds a `config` (golden files).
bool load_weights_file(const std::string& path, KimiWeights* out, std::string* err);

}  // namespace ktune::kimi

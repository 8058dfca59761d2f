#include "kernels/kimi/state.h"

#include <algorithm>
#include <string>

#include "base/bf16.h"
#include "base/parallel.h"
#include "base/rng.h"

namespace ktune::kimi {

namespace {
void fill_bf16(std::vector<uint16_t>& v, size_t n, uint64_t stream, double sd) {
  parallel_for(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) v[i] = double_to_bf16(sd * normal(stream, i));
  });
}
}  // namespace

void make_layer_state(const KimiConfig& cfg, uint64_t seed, int layer, int context, int capacity, LayerState* L) {
  std::string p = "state." + std::to_string(layer) + ".";
  if (cfg.is_kda(layer)) {
    size_t n = size_t(cfg.kda_heads) * cfg.kda_head_dim * cfg.kda_head_dim;
    L->S.resize(n);
    uint64_t s = stream_id(seed, p + "S");
    parallel_for(n, [&](size_t b, size_t e) {
      for (size_t j = b; j < e; ++j) L->S[j] = float(0.05 * normal(s, j));
    });
    size_t w = size_t(3) * cfg.kda_dim();
    for (auto [vec, name] : {std::pair{&L->cq, "cq"}, {&L->ck, "ck"}, {&L->cv, "cv"}}) {
      vec->resize(w);
      fill_bf16(*vec, w, stream_id(seed, p + name), 0.1);
    }
  } else {
    capacity = std::max(capacity, context + 1);
    L->c_kv.assign(size_t(capacity) * cfg.kv_lora, 0);
    L->k_rope.assign(size_t(capacity) * cfg.qk_rope, 0);
    fill_bf16(L->c_kv, size_t(context) * cfg.kv_lora, stream_id(seed, p + "c_kv"), 0.1);
    fill_bf16(L->k_rope, size_t(context) * cfg.qk_rope, stream_id(seed, p + "k_rope"), 0.1);
  }
}

KimiState make_state(const KimiConfig& cfg, uint64_t seed, int context, int capacity) {
  KimiState st;
  st.context = context;
  st.layers.resize(cfg.layers());
  for (int i = 0; i < cfg.layers(); ++i) make_layer_state(cfg, seed, i, context, capacity, &st.layers[i]);
  return st;
}

KimiState SeededStates::get(uint64_t seed, int context, int longest) {
  longest = std::max(longest, context);
  auto it = std::find_if(kept_.begin(), kept_.end(), [&](const Kept& k) { return k.seed == seed; });
  if (it != kept_.end() && it->state.context < longest) {
    kept_.erase(it);
    it = kept_.end();
  }
  if (it == kept_.end()) {
    kept_.push_front({seed, make_state(cfg_, seed, longest, capacity_)});
    if (kept_.size() > kKept) kept_.pop_back();
  } else {
    kept_.splice(kept_.begin(), kept_, it);
  }
  // The kept state's first `context` rows, zeros after them, and room for
  // as many rows as make_state gives this context.
  const KimiState& kept = kept_.front().state;
  const size_t rows = size_t(std::max(capacity_, context + 1));
  KimiState st;
  st.layers.resize(kept.layers.size());
  for (int i = 0; i < cfg_.layers(); ++i) {
    const LayerState& from = kept.layers[i];
    LayerState& L = st.layers[i];
    if (cfg_.is_kda(i)) {
      L = from;
      continue;
    }
    L.c_kv.assign(rows * cfg_.kv_lora, 0);
    L.k_rope.assign(rows * cfg_.qk_rope, 0);
    std::copy_n(from.c_kv.begin(), size_t(context) * cfg_.kv_lora, L.c_kv.begin());
    std::copy_n(from.k_rope.begin(), size_t(context) * cfg_.qk_rope, L.k_rope.begin());
  }
  st.context = context;
  return st;
}

std::vector<uint16_t> make_token(const KimiConfig& cfg, uint64_t seed) {
  std::vector<uint16_t> t(cfg.hidden);
  fill_bf16(t, t.size(), stream_id(seed, "token"), 0.25);
  return t;
}

}  // namespace ktune::kimi

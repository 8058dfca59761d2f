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

KimiState make_state(const KimiConfig& cfg, uint64_t seed, int context, int capacity) {
  KimiState st;
  st.context = context;
  capacity = std::max(capacity, context + 1);
  st.layers.resize(cfg.layers());
  for (int i = 0; i < cfg.layers(); ++i) {
    LayerState& L = st.layers[i];
    std::string p = "state." + std::to_string(i) + ".";
    if (cfg.is_kda(i)) {
      size_t n = size_t(cfg.kda_heads) * cfg.kda_head_dim * cfg.kda_head_dim;
      L.S.resize(n);
      uint64_t s = stream_id(seed, p + "S");
      parallel_for(n, [&](size_t b, size_t e) {
        for (size_t j = b; j < e; ++j) L.S[j] = float(0.05 * normal(s, j));
      });
      size_t w = size_t(3) * cfg.kda_dim();
      for (auto [vec, name] : {std::pair{&L.cq, "cq"}, {&L.ck, "ck"}, {&L.cv, "cv"}}) {
        vec->resize(w);
        fill_bf16(*vec, w, stream_id(seed, p + name), 0.1);
      }
    } else {
      L.c_kv.assign(size_t(capacity) * cfg.kv_lora, 0);
      L.k_rope.assign(size_t(capacity) * cfg.qk_rope, 0);
      fill_bf16(L.c_kv, size_t(context) * cfg.kv_lora, stream_id(seed, p + "c_kv"), 0.1);
      fill_bf16(L.k_rope, size_t(context) * cfg.qk_rope, stream_id(seed, p + "k_rope"), 0.1);
    }
  }
  return st;
}

std::vector<uint16_t> make_token(const KimiConfig& cfg, uint64_t seed) {
  std::vector<uint16_t> t(cfg.hidden);
  fill_bf16(t, t.size(), stream_id(seed, "token"), 0.25);
  return t;
}

}  // namespace ktune::kimi

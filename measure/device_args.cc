#include "measure/device_args.h"

namespace ktune::measure {

bool bind_weights(const kimi::KimiWeights& w, KimiDeviceArgs* a, std::string* err, const PlaceTensor& place) {
  auto at = [&](auto* p) { return place && p ? static_cast<decltype(p)>(place(p)) : p; };
  auto w4 = [&](const kimi::QLinear& q) { return KtW4{at(q.w_q), at(q.scales), at(q.zeros)}; };
  const kimi::KimiConfig& c = w.cfg;
  if (c.layers() > KT_MAX_LAYERS) {
    *err = "the config has " + std::to_string(c.layers()) + " layers; the kernel ABI allows " +
           std::to_string(KT_MAX_LAYERS);
    return false;
  }
  for (int i = 0; i < c.layers(); ++i) {
    const kimi::LayerWeights& L = w.layers[i];
    KtLayer& o = a->layers[i];
    o.attn_norm = at(L.attn_norm);
    o.moe_norm = at(L.moe_norm);
    if (c.is_kda(i)) {
      o.kda.q = w4(L.kda.q);
      o.kda.k = w4(L.kda.k);
      o.kda.v = w4(L.kda.v);
      o.kda.g = w4(L.kda.g);
      o.kda.o = w4(L.kda.o);
      o.kda.beta = at(L.kda.beta);
      o.kda.conv_w = at(L.kda.conv_w);
    } else {
      o.mla.q = w4(L.mla.q);
      o.mla.kv_a = w4(L.mla.kv_a);
      o.mla.kv_b = w4(L.mla.kv_b);
      o.mla.o = w4(L.mla.o);
    }
    const kimi::MoeWeights& m = L.moe;
    o.moe.router = at(m.router);
    o.moe.gate = w4(m.gate);
    o.moe.up = w4(m.up);
    o.moe.down = w4(m.down);
    o.moe.s_gate = w4(m.s_gate);
    o.moe.s_up = w4(m.s_up);
    o.moe.s_down = w4(m.s_down);
  }
  return true;
}

void bind_state(const kimi::KimiConfig& c, kimi::KimiState* st, KimiDeviceArgs* a) {
  for (int i = 0; i < c.layers(); ++i) {
    kimi::LayerState& L = st->layers[i];
    KtLayer& o = a->layers[i];
    if (c.is_kda(i)) {
      o.kda.S = L.S.data();
      o.kda.win[0] = L.cq.data();
      o.kda.win[1] = L.ck.data();
      o.kda.win[2] = L.cv.data();
    } else {
      o.mla.c_kv = L.c_kv.data();
      o.mla.k_rope = L.k_rope.data();
    }
  }
  a->context = st->context;
}

KimiDeviceArgs prepare_args(const KimiDeviceArgs& a, uint8_t* scratch) {
  KimiDeviceArgs p{};
  for (int i = 0; i < KT_MAX_LAYERS; ++i) {
    const KtLayer& from = a.layers[i];
    KtLayer& to = p.layers[i];
    to.attn_norm = from.attn_norm;
    to.moe_norm = from.moe_norm;
    to.kda = from.kda;
    to.kda.S = nullptr;
    for (auto& w : to.kda.win) w = nullptr;
    to.mla = from.mla;
    to.mla.c_kv = nullptr;
    to.mla.k_rope = nullptr;
    to.moe = from.moe;
  }
  p.scratch = scratch;
  return p;
}

}  // namespace ktune::measure

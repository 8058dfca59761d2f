#include "measure/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "base/bf16.h"
#include "base/compare.h"
#include "base/tensor.h"
#include "base/text.h"

namespace ktune::measure {

OracleCase compute_oracle_case(const kimi::KimiWeights& w, int seed, int context, const kimi::Routing* routing) {
  OracleCase c;
  c.seed = seed;
  c.context = context;
  c.state = kimi::make_state(w.cfg, uint64_t(seed), context);
  std::vector<uint16_t> token = kimi::make_token(w.cfg, uint64_t(seed));
  kimi::oracle_step(w, &c.state, token.data(), &c.out, nullptr, routing);
  return c;
}

SeedPrefix compute_seed_prefix(const kimi::KimiWeights& w, int seed) {
  const kimi::KimiConfig& cfg = w.cfg;
  SeedPrefix p;
  p.seed = seed;
  while (p.layers < cfg.layers() && cfg.is_kda(p.layers)) ++p.layers;
  p.state.layers.resize(p.layers);
  for (int i = 0; i < p.layers; ++i) kimi::make_layer_state(cfg, uint64_t(seed), i, 0, 0, &p.state.layers[i]);
  std::vector<uint16_t> token = kimi::make_token(cfg, uint64_t(seed));
  p.hidden = kimi::start_step(cfg, token.data(), &p.out);
  kimi::oracle_layers(w, &p.state, 0, p.layers, &p.hidden, &p.out);
  return p;
}

OracleCase finish_oracle_case(const kimi::KimiWeights& w, const SeedPrefix& prefix, int context) {
  const kimi::KimiConfig& cfg = w.cfg;
  OracleCase c;
  c.seed = prefix.seed;
  c.context = context;
  c.state.context = context;
  c.state.layers.resize(cfg.layers());
  for (int i = 0; i < cfg.layers(); ++i) {
    if (i < prefix.layers)
      c.state.layers[i] = prefix.state.layers[i];
    else
      kimi::make_layer_state(cfg, uint64_t(prefix.seed), i, context, 0, &c.state.layers[i]);
  }
  c.out = prefix.out;
  std::vector<double> hidden = prefix.hidden;
  kimi::oracle_layers(w, &c.state, prefix.layers, cfg.layers(), &hidden, &c.out);
  kimi::finish_step(&c.state, hidden, &c.out);
  return c;
}

json CaseCheck::to_json() const {
  json j = {{"seed", seed},       {"context", context}, {"passed", passed}, {"experts_match", experts_match},
            {"failure", failure}, {"metrics", metrics}};
  if (!routing_note.empty()) j["routing_note"] = routing_note;
  return j;
}

namespace {

// Concatenated bf16 or f32 tensors of the output file vs reference arrays.
struct Pair {
  std::vector<double> got, want;
  void add_bf16(const Tensor* t, const std::vector<uint16_t>& ref) {
    std::vector<float> values(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) values[i] = bf16_to_float(ref[i]);
    add_bf16(t, values);
  }
  // bf16 values against floats that hold bf16 values (router logits).
  void add_bf16(const Tensor* t, const std::vector<float>& ref) {
    for (size_t i = 0; i < ref.size(); ++i) {
      got.push_back(t && i < t->numel() ? bf16_to_float(t->as<uint16_t>()[i]) : NAN);
      want.push_back(ref[i]);
    }
  }
  void add_f32(const Tensor* t, const std::vector<float>& ref) {
    for (size_t i = 0; i < ref.size(); ++i) {
      got.push_back(t && i < t->numel() ? t->as<float>()[i] : NAN);
      want.push_back(ref[i]);
    }
  }
};

}  // namespace

bool write_case_outputs(const std::string& path, const kimi::KimiConfig& cfg, const kimi::KimiState& st,
                        const kimi::StepOutput& out, std::string* err) {
  TensorFile f;
  auto put = [&](const std::string& name, DType t, std::vector<int64_t> shape, const void* data) {
    Tensor x = Tensor::make(t, std::move(shape));
    std::memcpy(x.data, data, x.nbytes);
    f.tensors.emplace(name, std::move(x));
  };
  put("hidden", DType::BF16, {cfg.hidden}, out.hidden.data());
  std::vector<int32_t> topk;
  for (auto& l : out.topk) topk.insert(topk.end(), l.begin(), l.end());
  put("topk", DType::I32, {cfg.layers(), cfg.n_active}, topk.data());
  for (int i = 0; i < cfg.layers(); ++i) {
    std::string p = "L" + std::to_string(i) + ".";
    const kimi::LayerState& L = st.layers[i];
    if (cfg.is_kda(i)) {
      put(p + "S", DType::F32, {cfg.kda_heads, cfg.kda_head_dim, cfg.kda_head_dim}, L.S.data());
      put(p + "cq", DType::BF16, {3, cfg.kda_dim()}, L.cq.data());
      put(p + "ck", DType::BF16, {3, cfg.kda_dim()}, L.ck.data());
      put(p + "cv", DType::BF16, {3, cfg.kda_dim()}, L.cv.data());
    } else {
      put(p + "c_kv_row", DType::BF16, {cfg.kv_lora}, out.ckv_row[i].data());
      put(p + "k_rope_row", DType::BF16, {cfg.qk_rope}, out.krope_row[i].data());
    }
    if (size_t(i) < out.attn_out.size() && !out.attn_out[i].empty())
      put(p + "attn_out", DType::BF16, {int64_t(out.attn_out[i].size())}, out.attn_out[i].data());
    if (size_t(i) < out.router_logits.size() && !out.router_logits[i].empty()) {
      std::vector<uint16_t> logits;
      for (float v : out.router_logits[i]) logits.push_back(float_to_bf16(v));
      put(p + "logits", DType::BF16, {int64_t(logits.size())}, logits.data());
    }
  }
  return write_safetensors(path, f, err);
}

namespace {

// check_case on an output file already read.
void check_outputs(const kimi::KimiConfig& cfg, const OracleCase& ref, const TensorFile& f, const Gate& gate,
                   CaseCheck* out) {
  out->seed = ref.seed;
  out->context = ref.context;
  out->passed = true;
  auto judge = [&](const std::string& name, const Pair& p) {
    Similarity s = similarity(p.got.size(), [&](size_t i) { return std::pair{p.got[i], p.want[i]}; });
    out->metrics[name] = s.to_json();
    std::string why;
    if (s.nonfinite) why = std::to_string(s.nonfinite) + " of " + std::to_string(s.n) + " values NaN/Inf or unwritten";
    else if (s.cosine < gate.min_cosine)
      why = "cosine " + std::to_string(s.cosine) + " < " + std::to_string(gate.min_cosine);
    else if (!(s.rel_l2 <= gate.max_rel_l2))
      why = "relative L2 error " + std::to_string(s.rel_l2) + " > " + std::to_string(gate.max_rel_l2);
    if (!why.empty() && out->passed) {
      out->passed = false;
      out->failure = name + ": " + why;
    }
  };
  Pair hidden;
  hidden.add_bf16(f.find("hidden"), ref.out.hidden);
  judge("hidden", hidden);
  const Tensor* topk = f.find("topk");
  for (int i = 0; i < cfg.layers(); ++i) {
    std::string p = "L" + std::to_string(i) + ".";
    const kimi::LayerState& L = ref.state.layers[i];
    if (cfg.is_kda(i)) {
      Pair S, conv;
      S.add_f32(f.find(p + "S"), L.S);
      conv.add_bf16(f.find(p + "cq"), L.cq);
      conv.add_bf16(f.find(p + "ck"), L.ck);
      conv.add_bf16(f.find(p + "cv"), L.cv);
      judge(p + "S", S);
      judge(p + "conv", conv);
    } else {
      Pair row;
      row.add_bf16(f.find(p + "c_kv_row"), ref.out.ckv_row[i]);
      row.add_bf16(f.find(p + "k_rope_row"), ref.out.krope_row[i]);
      judge(p + "cache_row", row);
    }
    // Present when the variant reports it (abi.h, version 3 on); the
    // runner, not the variant, decides that.
    const Tensor* t = f.find(p + "attn_out");
    if (t && size_t(i) < ref.out.attn_out.size()) {
      Pair o;
      o.add_bf16(t, ref.out.attn_out[i]);
      judge(p + "attn_out", o);
    }
    // Present when the variant reports them (abi.h, version 4 on).
    if (const Tensor* l = f.find(p + "logits"); l && size_t(i) < ref.out.router_logits.size()) {
      Pair o;
      o.add_bf16(l, ref.out.router_logits[i]);
      judge(p + "logits", o);
    }
    std::set<int> want(ref.out.topk[i].begin(), ref.out.topk[i].end()), got;
    if (topk && topk->numel() == size_t(cfg.layers()) * cfg.n_active)
      got.insert(topk->as<int32_t>() + size_t(i) * cfg.n_active, topk->as<int32_t>() + size_t(i + 1) * cfg.n_active);
    out->experts_match = out->experts_match && got == want;
  }
}

// The distance from a bf16 value to its neighbours (one unit in the last
// place of its binade: 8 significant bits).
double bf16_ulp(double v) {
  int e = 0;
  std::frexp(v == 0 ? 1e-30 : v, &e);  // |v| in [2^(e-1), 2^e)
  return std::ldexp(1.0, e - 8);
}

bool read_routing(const kimi::KimiConfig& cfg, const TensorFile& f, kimi::Routing* out, std::string* err) {
  const Tensor* t = f.find("topk");
  if (!t || t->numel() != size_t(cfg.layers()) * cfg.n_active) {
    *err = "the output has no topk tensor of " + std::to_string(cfg.layers() * cfg.n_active) + " experts";
    return false;
  }
  out->assign(cfg.layers(), {});
  for (int i = 0; i < cfg.layers(); ++i)
    for (int j = 0; j < cfg.n_active; ++j) {
      const int e = t->as<int32_t>()[size_t(i) * cfg.n_active + j];
      if (e < 0 || e >= cfg.n_experts) {
        *err = "expert " + std::to_string(e) + " out of range in layer " + std::to_string(i);
        return false;
      }
      (*out)[i].push_back(e);
    }
  return true;
}

// Layer `layer`'s router logits from the output file, when the kernel
// reported them (abi.h, version 4 on) and they are all finite.
bool read_logits(const kimi::KimiConfig& cfg, const TensorFile& f, int layer, std::vector<float>* out) {
  const Tensor* t = f.find("L" + std::to_string(layer) + ".logits");
  if (!t || t->dtype != DType::BF16 || t->numel() != size_t(cfg.n_experts)) return false;
  out->clear();
  for (size_t e = 0; e < t->numel(); ++e) {
    out->push_back(bf16_to_float(t->as<uint16_t>()[e]));
    if (!std::isfinite(out->back())) return false;
  }
  return true;
}

}  // namespace

bool check_case(const kimi::KimiConfig& cfg, const OracleCase& ref, const std::string& file, const Gate& gate,
                CaseCheck* out, std::string* err) {
  TensorFile f;
  if (!read_safetensors(file, &f, err)) return false;
  check_outputs(cfg, ref, f, gate, out);
  return true;
}

double topk_shortfall_ulps(const std::vector<float>& logits, const std::vector<int>& chosen) {
  std::vector<bool> in(logits.size(), false);
  for (int e : chosen) {
    if (e < 0 || size_t(e) >= logits.size() || in[e]) return INFINITY;  // out of range or twice
    in[e] = true;
  }
  double lowest_in = INFINITY, highest_out = -INFINITY;
  for (size_t e = 0; e < logits.size(); ++e) {
    if (in[e]) lowest_in = std::min(lowest_in, double(logits[e]));
    else highest_out = std::max(highest_out, double(logits[e]));
  }
  if (lowest_in >= highest_out) return 0;
  return (highest_out - lowest_in) / bf16_ulp(std::max(std::fabs(lowest_in), std::fabs(highest_out)));
}

bool within_rounding_of_topk(const std::vector<float>& logits, const std::vector<int>& chosen) {
  return topk_shortfall_ulps(logits, chosen) <= 1.0;
}

bool recheck_near_ties(const kimi::KimiWeights& w, const OracleCase& ref, const std::string& file, const Gate& gate,
                       CaseCheck* check, std::string* err) {
  (void)err;  // nothing here fails: what cannot be read leaves the first check standing
  if (check->experts_match) return true;
  kimi::Routing kernel;
  std::string why;
  // An unreadable file, or experts the kernel did not write or out of
  // range, are a difference like any other: the first check stands.
  TensorFile f;
  if (!read_safetensors(file, &f, &why) || !read_routing(w.cfg, f, &kernel, &why)) return true;
  // Layer by layer: a flip in one layer changes what every later layer
  // sees, so each layer's experts are judged against the oracle routed as
  // the kernel routed the layers before it.
  kimi::Routing forced(w.cfg.layers());
  OracleCase routed;
  const OracleCase* oracle = &ref;
  std::string flipped;
  bool all_own = true;  // every flip judged by the kernel's own logits
  for (int i = 0; i < w.cfg.layers(); ++i) {
    std::set<int> got(kernel[i].begin(), kernel[i].end());
    std::set<int> want(oracle->out.topk[i].begin(), oracle->out.topk[i].end());
    if (got == want) continue;
    if (size_t(i) >= oracle->out.router_logits.size()) return true;
    const double ulps = topk_shortfall_ulps(oracle->out.router_logits[i], kernel[i]);
    std::vector<float> own;  // the kernel's logits, when it reports them
    const bool reported = read_logits(w.cfg, f, i, &own);
    const double own_ulps = reported ? topk_shortfall_ulps(own, kernel[i]) : 0;
    if (reported ? own_ulps > 0 : ulps > 1.0) {  // a real difference: the first check stands, and says where
      const std::string note =
          reported ? formatted("layer %d's experts are not the top-%d of the kernel's own logits (%.1f bf16 ulps short)", i,
                               w.cfg.n_active, own_ulps)
                   : formatted("other experts than the oracle's in layer %d, %.1f bf16 ulps below its top-%d%s", i, ulps,
                               w.cfg.n_active, flipped.empty() ? "" : " (after near-ties in earlier layers)");
      check->routing_note = note;
      if (!check->passed) check->failure += std::string("; ") + note;
      return true;
    }
    all_own = all_own && reported;
    flipped += (flipped.empty() ? "" : ", ") + formatted("%d (%.1f ulps)", i, ulps);
    forced[i] = kernel[i];
    routed = compute_oracle_case(w, ref.seed, ref.context, &forced);
    oracle = &routed;
  }
  if (flipped.empty()) return true;
  CaseCheck again;
  check_outputs(w.cfg, routed, f, gate, &again);
  again.experts_match = false;  // still not the oracle's own top-k
  again.routing_note =
      "experts differ from the oracle's top-k in layer(s) " + flipped + " of its logits, " +
      (all_own ? "the top-k of the kernel's own logits; checked, the logits too,"
               : "within one bf16 ulp; checked") +
      " against the oracle routed the same way";
  *check = again;
  return true;
}

}  // namespace ktune::measure

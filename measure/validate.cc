#include "measure/validate.h"

#include <algorithm>
#include <set>

#include "base/bf16.h"
#include "base/compare.h"
#include "base/tensor.h"

namespace ktune::measure {

OracleCase compute_oracle_case(const kimi::KimiWeights& w, int seed, int context) {
  OracleCase c;
  c.seed = seed;
  c.context = context;
  c.state = kimi::make_state(w.cfg, uint64_t(seed), context);
  std::vector<uint16_t> token = kimi::make_token(w.cfg, uint64_t(seed));
  kimi::oracle_step(w, &c.state, token.data(), &c.out);
  return c;
}

json CaseCheck::to_json() const {
  return {{"seed", seed}, {"context", context}, {"passed", passed}, {"experts_match", experts_match},
          {"failure", failure}, {"metrics", metrics}};
}

namespace {

// Concatenated bf16 or f32 tensors of the output file vs reference arrays.
struct Pair {
  std::vector<double> got, want;
  void add_bf16(const Tensor* t, const std::vector<uint16_t>& ref) {
    size_t n = ref.size();
    for (size_t i = 0; i < n; ++i) {
      got.push_back(t && i < t->numel() ? bf16_to_float(t->as<uint16_t>()[i]) : NAN);
      want.push_back(bf16_to_float(ref[i]));
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

bool check_case(const kimi::KimiConfig& cfg, const OracleCase& ref, const std::string& file, const Gate& gate,
                CaseCheck* out, std::string* err) {
  TensorFile f;
  if (!read_safetensors(file, &f, err)) return false;
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
    std::set<int> want(ref.out.topk[i].begin(), ref.out.topk[i].end()), got;
    if (topk && topk->numel() == size_t(cfg.layers()) * cfg.n_active)
      got.insert(topk->as<int32_t>() + size_t(i) * cfg.n_active, topk->as<int32_t>() + size_t(i + 1) * cfg.n_active);
    out->experts_match = out->experts_match && got == want;
  }
  return true;
}

}  // namespace ktune::measure

#include "kernels/kimi/golden.h"

#include <algorithm>
#include <cstdlib>

#include "base/bf16.h"
#include "base/fs.h"

namespace ktune::kimi {

bool GoldenFile::load(const std::string& path, std::string* err) {
  if (!load_weights_file(path, &weights, err)) return false;
  json cj = json::parse(weights.file.metadata.value("cases", std::string("[]")), nullptr, false);
  if (cj.is_discarded() || !cj.is_array()) {
    *err = path + ": cases metadata is not a JSON list";
    return false;
  }
  cases.clear();
  for (size_t i = 0; i < cj.size(); ++i)
    cases.push_back({int(i), cj[i].value("seed", 0), cj[i].value("context", 0), cj[i].value("steps", 1)});
  return true;
}

namespace {
template <class T>
std::vector<T> copy_tensor(const TensorFile& f, const std::string& name) {
  const Tensor* t = f.find(name);
  if (!t) return {};
  return std::vector<T>(t->as<T>(), t->as<T>() + t->numel());
}
}  // namespace

KimiState GoldenFile::fed_state(const GoldenCase& c, int capacity) const {
  const KimiConfig& cfg = weights.cfg;
  KimiState st;
  st.context = c.context;
  st.layers.resize(cfg.layers());
  std::string p = "case" + std::to_string(c.index) + ".in.";
  for (int i = 0; i < cfg.layers(); ++i) {
    LayerState& L = st.layers[i];
    std::string b = p + std::to_string(i) + ".";
    if (cfg.is_kda(i)) {
      L.S = copy_tensor<float>(weights.file, b + "S");
      L.cq = copy_tensor<uint16_t>(weights.file, b + "cq");
      L.ck = copy_tensor<uint16_t>(weights.file, b + "ck");
      L.cv = copy_tensor<uint16_t>(weights.file, b + "cv");
    } else {
      int rows = std::max(capacity, c.context + c.steps);
      L.c_kv = copy_tensor<uint16_t>(weights.file, b + "c_kv");
      L.k_rope = copy_tensor<uint16_t>(weights.file, b + "k_rope");
      L.c_kv.resize(size_t(rows) * cfg.kv_lora, 0);
      L.k_rope.resize(size_t(rows) * cfg.qk_rope, 0);
    }
  }
  return st;
}

std::vector<uint16_t> GoldenFile::token(const GoldenCase& c) const {
  return copy_tensor<uint16_t>(weights.file, "case" + std::to_string(c.index) + ".token");
}

namespace {

GoldenCheck compare_bf16(const std::string& name, const std::vector<uint16_t>& got, const Tensor* want,
                         double min_cos) {
  GoldenCheck ch{name, {}, true, false};
  if (!want || want->numel() != got.size()) {
    ch.sim.cosine = 0;
    return ch;
  }
  const uint16_t* w = want->as<uint16_t>();
  ch.sim = similarity(got.size(), [&](size_t i) {
    return std::pair{double(bf16_to_float(got[i])), double(bf16_to_float(w[i]))};
  });
  ch.ok = ch.sim.nonfinite == 0 && ch.sim.cosine >= min_cos;
  return ch;
}

}  // namespace

namespace {

// The state after step k-1 as the golden file recorded it.
void load_recorded_state(const GoldenFile& g, const GoldenCase& c, int k, KimiState* st, std::vector<uint16_t>* token) {
  const KimiConfig& cfg = g.weights.cfg;
  const TensorFile& f = g.weights.file;
  std::string p = "case" + std::to_string(c.index) + ".step" + std::to_string(k - 1) + ".";
  *token = copy_tensor<uint16_t>(f, p + "hidden");
  for (int i = 0; i < cfg.layers(); ++i) {
    std::string b = p + std::to_string(i) + ".";
    LayerState& L = st->layers[i];
    if (cfg.is_kda(i)) {
      L.S = copy_tensor<float>(f, b + "S");
      L.cq = copy_tensor<uint16_t>(f, b + "cq");
      L.ck = copy_tensor<uint16_t>(f, b + "ck");
      L.cv = copy_tensor<uint16_t>(f, b + "cv");
    } else {
      std::vector<uint16_t> row = copy_tensor<uint16_t>(f, b + "c_kv_row");
      std::vector<uint16_t> kr = copy_tensor<uint16_t>(f, b + "k_rope_row");
      std::copy(row.begin(), row.end(), L.c_kv.begin() + size_t(c.context + k - 1) * cfg.kv_lora);
      std::copy(kr.begin(), kr.end(), L.k_rope.begin() + size_t(c.context + k - 1) * cfg.qk_rope);
    }
  }
  st->context = c.context + k;
}

}  // namespace

bool check_golden_case(const GoldenFile& g, const GoldenCase& c, const StepFn& step, const GoldenOptions& opts,
                       std::vector<GoldenCheck>* checks, std::string* err) {
  const KimiConfig& cfg = g.weights.cfg;
  const TensorFile& f = g.weights.file;
  const double min_cos = opts.min_cosine;
  const bool experts_as_set = opts.experts_as_set;
  KimiState st = g.fed_state(c, c.context + c.steps);
  std::vector<uint16_t> token = g.token(c);
  for (int k = 0; k < c.steps; ++k) {
    if (opts.refeed && k > 0) load_recorded_state(g, c, k, &st, &token);
    StepOutput out;
    if (!step(&st, token, &out, err)) return false;
    std::string p = "case" + std::to_string(c.index) + ".step" + std::to_string(k) + ".";
    checks->push_back(compare_bf16(p + "hidden", out.hidden, f.find(p + "hidden"), min_cos));
    for (int i = 0; i < cfg.layers(); ++i) {
      std::string b = p + std::to_string(i) + ".";
      const LayerState& L = st.layers[i];
      if (cfg.is_kda(i)) {
        const Tensor* want = f.find(b + "S");
        GoldenCheck ch{b + "S", {}, true, false};
        if (want && want->numel() == L.S.size()) {
          const float* w = want->as<float>();
          ch.sim = similarity(L.S.size(), [&](size_t j) { return std::pair{double(L.S[j]), double(w[j])}; });
          ch.ok = ch.sim.nonfinite == 0 && ch.sim.cosine >= min_cos;
        }
        checks->push_back(ch);
        checks->push_back(compare_bf16(b + "cq", L.cq, f.find(b + "cq"), min_cos));
        checks->push_back(compare_bf16(b + "ck", L.ck, f.find(b + "ck"), min_cos));
        checks->push_back(compare_bf16(b + "cv", L.cv, f.find(b + "cv"), min_cos));
      } else {
        checks->push_back(compare_bf16(b + "c_kv_row", out.ckv_row[i], f.find(b + "c_kv_row"), min_cos));
        checks->push_back(compare_bf16(b + "k_rope_row", out.krope_row[i], f.find(b + "k_rope_row"), min_cos));
      }
      GoldenCheck ex{b + "topk_idx", {}, true, false};
      const Tensor* want = f.find(b + "topk_idx");
      ex.same_experts = want && want->numel() == out.topk[i].size();
      if (ex.same_experts) {
        std::vector<int> a(out.topk[i]), b(want->as<int32_t>(), want->as<int32_t>() + want->numel());
        if (experts_as_set) {
          std::sort(a.begin(), a.end());
          std::sort(b.begin(), b.end());
        }
        ex.same_experts = a == b;
      }
      ex.sim.cosine = ex.same_experts ? 1 : 0;
      ex.ok = ex.same_experts;
      checks->push_back(ex);
    }
    token = out.hidden;
  }
  return true;
}

std::string find_golden_dir() {
  if (const char* d = std::getenv("KTUNE_GOLDEN_DIR"); d && *d) return d;
#ifdef KTUNE_SOURCE_DIR
  for (const char* rel : {"/../shared/golden", "/shared/golden"}) {
    std::string p = std::string(KTUNE_SOURCE_DIR) + rel;
    if (file_exists(p + "/kimi-tiny.safetensors")) return p;
  }
#endif
  // The team's shared folder, where a checkout elsewhere can still see it.
  if (file_exists("/work/shared/golden/kimi-tiny.safetensors")) return "/work/shared/golden";
  return "";
}

}  // namespace ktune::kimi

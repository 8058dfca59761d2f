#include "kernels/kimi/weights.h"

#include <algorithm>
#include <cmath>

#include "base/bf16.h"
#include "base/fs.h"
#include "base/parallel.h"
#include "base/rng.h"

namespace ktune::kimi {

// Bump when the generator changes: stale cache files are then regenerated.
static const char* kGeneratorVersion = "kimi-weights-v1";

QLinear QLinear::expert(int e) const {
  QLinear q = *this;
  q.count = 1;
  q.w_q += size_t(e) * (K / 2) * N;
  q.scales += size_t(e) * (K / group) * N;
  q.zeros += size_t(e) * (K / group) * N;
  return q;
}

size_t QLinear::bytes() const { return size_t(K / 2) * N + 2 * 2 * size_t(K / group) * N; }

namespace {

enum class Init { W4, Normal, Ones };

struct WeightRecipe {
  TensorSpec spec;
  Init init;
  double std = 0;
};

void add_w4(std::vector<WeightRecipe>* out, const std::string& base, int count, int K, int N, int group) {
  std::vector<int64_t> lead;
  if (count > 0) lead.push_back(count);
  auto shape = [&](std::vector<int64_t> s) {
    s.insert(s.begin(), lead.begin(), lead.end());
    return s;
  };
  out->push_back({{base + ".w_q", DType::U8, shape({K / 2, N})}, Init::W4, 0.02});
  out->push_back({{base + ".scales", DType::BF16, shape({K / group, N})}, Init::W4, 0.02});
  out->push_back({{base + ".zeros", DType::BF16, shape({K / group, N})}, Init::W4, 0.02});
}

std::vector<WeightRecipe> recipes(const KimiConfig& c) {
  std::vector<WeightRecipe> r;
  const int d = c.hidden, g = c.group;
  for (int i = 0; i < c.layers(); ++i) {
    std::string b = "blocks." + std::to_string(i) + ".";
    r.push_back({{b + "attn_norm", DType::BF16, {d}}, Init::Ones});
    r.push_back({{b + "moe_norm", DType::BF16, {d}}, Init::Ones});
    if (c.is_kda(i)) {
      const int C = c.kda_dim();
      for (const char* p : {"q_proj", "k_proj", "v_proj", "g_proj"}) add_w4(&r, b + "attn." + p, 0, d, C, g);
      add_w4(&r, b + "attn.o_proj", 0, C, d, g);
      r.push_back({{b + "attn.beta_proj.weight", DType::BF16, {c.kda_heads, d}}, Init::Normal, 0.02});
      r.push_back({{b + "attn.conv_w", DType::BF16, {3, C, c.short_conv}}, Init::Normal, 0.1});
    } else {
      add_w4(&r, b + "attn.q_proj", 0, d, c.mla_q_dim(), g);
      add_w4(&r, b + "attn.kv_a", 0, d, c.kv_a_dim(), g);
      add_w4(&r, b + "attn.kv_b", 0, c.kv_lora, c.kv_b_dim(), g);
      add_w4(&r, b + "attn.o_proj", 0, c.mla_o_dim(), d, g);
    }
    r.push_back({{b + "moe.router.weight", DType::BF16, {c.n_experts, d}}, Init::Normal, 0.02});
    add_w4(&r, b + "moe.gate", c.n_experts, d, c.moe_inter, g);
    add_w4(&r, b + "moe.up", c.n_experts, d, c.moe_inter, g);
    add_w4(&r, b + "moe.down", c.n_experts, c.moe_inter, d, g);
    add_w4(&r, b + "moe.s_gate", c.n_shared, d, c.moe_inter, g);
    add_w4(&r, b + "moe.s_up", c.n_shared, d, c.moe_inter, g);
    add_w4(&r, b + "moe.s_down", c.n_shared, c.moe_inter, d, g);
  }
  return r;
}

// Quantizes one W4A16 stack: draws w ~ N(0, std^2) per (matrix, k, n) and
// applies the spec's per-group, per-column asymmetric recipe.
void generate_w4(uint64_t stream, double std, int count, int K, int N, int group, uint8_t* w_q,
                 uint16_t* scales, uint16_t* zeros) {
  const int groups = K / group;
  size_t jobs = size_t(count) * groups;
  parallel_for(jobs, [&](size_t begin, size_t end) {
    std::vector<float> w(static_cast<size_t>(group));
    for (size_t job = begin; job < end; ++job) {
      size_t e = job / groups, gi = job % groups;
      for (int n = 0; n < N; ++n) {
        float wmin = INFINITY, wmax = -INFINITY;
        for (int r = 0; r < group; ++r) {
          size_t k = gi * group + r;
          w[r] = float(std * normal(stream, (e * K + k) * N + n));
          wmin = std::min(wmin, w[r]);
          wmax = std::max(wmax, w[r]);
        }
        float scale = std::max(wmax - wmin, 1e-8f) / 15.0f;
        float zero = std::clamp(std::nearbyint(-wmin / scale), 0.0f, 15.0f);
        size_t sz = (e * groups + gi) * N + n;
        scales[sz] = float_to_bf16(scale);
        zeros[sz] = float_to_bf16(zero);
        for (int r = 0; r < group; r += 2) {
          int q0 = int(std::clamp(std::nearbyint(w[r] / scale + zero), 0.0f, 15.0f));
          int q1 = int(std::clamp(std::nearbyint(w[r + 1] / scale + zero), 0.0f, 15.0f));
          size_t row = (gi * group + r) / 2;
          w_q[(e * (K / 2) + row) * N + n] = uint8_t(q0 | (q1 << 4));
        }
      }
    }
  });
}

bool bind_q(const TensorFile& f, const std::string& base, int K, int N, int group, QLinear* out, std::string* err) {
  const Tensor* w = f.find(base + ".w_q");
  const Tensor* s = f.find(base + ".scales");
  const Tensor* z = f.find(base + ".zeros");
  if (!w || !s || !z) {
    *err = "missing tensor " + base + ".{w_q,scales,zeros}";
    return false;
  }
  out->w_q = w->as<uint8_t>();
  out->scales = s->as<uint16_t>();
  out->zeros = z->as<uint16_t>();
  out->K = K;
  out->N = N;
  out->group = group;
  out->count = w->shape.size() == 3 ? int(w->shape[0]) : 1;
  return true;
}

}  // namespace

std::vector<TensorSpec> weight_specs(const KimiConfig& cfg) {
  std::vector<TensorSpec> out;
  for (auto& r : recipes(cfg)) out.push_back(r.spec);
  return out;
}

size_t KimiWeights::total_bytes() const {
  size_t n = 0;
  for (auto& [name, t] : file.tensors) n += t.nbytes;
  return n;
}

bool KimiWeights::bind(std::string* err) {
  for (auto& spec : weight_specs(cfg)) {
    const Tensor* t = file.find(spec.name);
    if (!t) {
      *err = "weights: missing tensor " + spec.name;
      return false;
    }
    if (t->dtype != spec.dtype || t->shape != spec.shape) {
      *err = "weights: tensor " + spec.name + " has the wrong dtype or shape";
      return false;
    }
  }
  const KimiConfig& c = cfg;
  layers.assign(c.layers(), {});
  for (int i = 0; i < c.layers(); ++i) {
    std::string b = "blocks." + std::to_string(i) + ".";
    LayerWeights& L = layers[i];
    L.attn_norm = file.find(b + "attn_norm")->as<uint16_t>();
    L.moe_norm = file.find(b + "moe_norm")->as<uint16_t>();
    const int d = c.hidden, g = c.group;
    bool ok = true;
    if (c.is_kda(i)) {
      const int C = c.kda_dim();
      ok = bind_q(file, b + "attn.q_proj", d, C, g, &L.kda.q, err) &&
           bind_q(file, b + "attn.k_proj", d, C, g, &L.kda.k, err) &&
           bind_q(file, b + "attn.v_proj", d, C, g, &L.kda.v, err) &&
           bind_q(file, b + "attn.g_proj", d, C, g, &L.kda.g, err) &&
           bind_q(file, b + "attn.o_proj", C, d, g, &L.kda.o, err);
      L.kda.beta = file.find(b + "attn.beta_proj.weight")->as<uint16_t>();
      L.kda.conv_w = file.find(b + "attn.conv_w")->as<uint16_t>();
    } else {
      ok = bind_q(file, b + "attn.q_proj", d, c.mla_q_dim(), g, &L.mla.q, err) &&
           bind_q(file, b + "attn.kv_a", d, c.kv_a_dim(), g, &L.mla.kv_a, err) &&
           bind_q(file, b + "attn.kv_b", c.kv_lora, c.kv_b_dim(), g, &L.mla.kv_b, err) &&
           bind_q(file, b + "attn.o_proj", c.mla_o_dim(), d, g, &L.mla.o, err);
    }
    MoeWeights& m = L.moe;
    m.router = file.find(b + "moe.router.weight")->as<uint16_t>();
    ok = ok && bind_q(file, b + "moe.gate", d, c.moe_inter, g, &m.gate, err) &&
         bind_q(file, b + "moe.up", d, c.moe_inter, g, &m.up, err) &&
         bind_q(file, b + "moe.down", c.moe_inter, d, g, &m.down, err) &&
         bind_q(file, b + "moe.s_gate", d, c.moe_inter, g, &m.s_gate, err) &&
         bind_q(file, b + "moe.s_up", d, c.moe_inter, g, &m.s_up, err) &&
         bind_q(file, b + "moe.s_down", c.moe_inter, d, g, &m.s_down, err);
    if (!ok) return false;
  }
  return true;
}

bool generate_weights(const KimiConfig& cfg, uint64_t seed, TensorFile* out, std::string* err) {
  std::string why;
  if (!cfg.check(&why)) {
    *err = why;
    return false;
  }
  TensorFile f;
  auto rs = recipes(cfg);
  for (auto& r : rs) f.tensors.emplace(r.spec.name, Tensor::make(r.spec.dtype, r.spec.shape));
  for (auto& r : rs) {
    Tensor& t = f.tensors.at(r.spec.name);
    const std::string& name = r.spec.name;
    if (r.init == Init::Ones) {
      std::fill(t.as<uint16_t>(), t.as<uint16_t>() + t.numel(), uint16_t(0x3f80));
    } else if (r.init == Init::Normal) {
      uint64_t s = stream_id(seed, name);
      uint16_t* p = t.as<uint16_t>();
      double sd = r.std;
      parallel_for(t.numel(), [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) p[i] = double_to_bf16(sd * normal(s, i));
      });
    } else if (name.size() > 4 && name.compare(name.size() - 4, 4, ".w_q") == 0) {
      std::string base = name.substr(0, name.size() - 4);
      Tensor& sc = f.tensors.at(base + ".scales");
      Tensor& ze = f.tensors.at(base + ".zeros");
      int count = t.shape.size() == 3 ? int(t.shape[0]) : 1;
      int K = int(t.shape[t.shape.size() - 2]) * 2, N = int(t.shape.back());
      generate_w4(stream_id(seed, base), r.std, count, K, N, cfg.group, t.as<uint8_t>(), sc.as<uint16_t>(),
                  ze.as<uint16_t>());
    }
  }
  f.metadata = {{"config", cfg.to_json().dump()}, {"seed", std::to_string(seed)}, {"generator", kGeneratorVersion}};
  *out = std::move(f);
  return true;
}

std::string weights_cache_path(const KimiConfig& cfg, uint64_t seed) {
  return join_path(cache_dir(), "kimi-" + cfg.name + "-w" + std::to_string(seed) + ".safetensors");
}

bool load_weights(const KimiConfig& cfg, uint64_t seed, KimiWeights* out, std::string* err, bool* generated) {
  std::string path = weights_cache_path(cfg, seed);
  KimiWeights w;
  w.cfg = cfg;
  std::string why;
  if (read_safetensors(path, &w.file, &why) && w.file.metadata.value("generator", "") == kGeneratorVersion &&
      w.file.metadata.value("config", "") == cfg.to_json().dump() && w.bind(&why)) {
    if (generated) *generated = false;
    *out = std::move(w);
    return true;
  }
  // Missing, stale or damaged: generate, cache, and map the cached copy.
  TensorFile fresh;
  if (!generate_weights(cfg, seed, &fresh, err)) return false;
  if (!make_dirs(cache_dir(), err) || !write_safetensors(path, fresh, err)) return false;
  w.file = TensorFile();
  if (!read_safetensors(path, &w.file, err) || !w.bind(err)) return false;
  if (generated) *generated = true;
  *out = std::move(w);
  return true;
}

bool load_weights_file(const std::string& path, KimiWeights* out, std::string* err) {
  KimiWeights w;
  if (!read_safetensors(path, &w.file, err)) return false;
  if (!w.file.metadata.contains("config")) {
    *err = path + ": no config in the metadata";
    return false;
  }
  json cj = json::parse(w.file.metadata["config"].get<std::string>(), nullptr, false);
  if (cj.is_discarded()) {
    *err = path + ": config metadata is not JSON";
    return false;
  }
  if (!KimiConfig::from_json(cj, &w.cfg, err) || !w.bind(err)) return false;
  *out = std::move(w);
  return true;
}

}  // namespace ktune::kimi

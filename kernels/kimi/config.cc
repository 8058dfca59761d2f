#include "kernels/kimi/config.h"

#include <algorithm>

namespace ktune::kimi {

int KimiConfig::max_context() const {
  int m = 0;
  for (int c : validate_contexts) m = std::max(m, c + 1);
  for (auto [c, steps] : timed_contexts) m = std::max(m, c + steps);
  return m;
}

double KimiConfig::bytes_per_step(int context) const {
  auto w4 = [&](double K, double N) { return K * N / 2 + 2 * 2 * (K / group) * N; };
  double b = 2.0 * hidden * 2;  // token in, hidden out
  for (int i = 0; i < layers(); ++i) {
    b += 2.0 * hidden * 2;  // the two norm weights
    if (is_kda(i)) {
      b += 4 * w4(hidden, kda_dim()) + w4(kda_dim(), hidden);
      b += 2.0 * kda_heads * hidden + 2.0 * 3 * kda_dim() * 4;               // beta_proj, conv_w
      b += 2.0 * 4 * kda_heads * kda_head_dim * kda_head_dim;                 // S read + written
      b += 2.0 * 2 * 3 * 3 * kda_dim();                                       // windows read + written
    } else {
      b += w4(hidden, mla_q_dim()) + w4(hidden, kv_a_dim()) + w4(kv_lora, kv_b_dim()) + w4(mla_o_dim(), hidden);
      b += 2.0 * (double(context) + 1) * (kv_lora + qk_rope);                // cache read, new row written
    }
    b += 2.0 * n_experts * hidden;                                            // router
    b += double(n_active + n_shared) * (2 * w4(hidden, moe_inter) + w4(moe_inter, hidden));
  }
  return b;
}

bool KimiConfig::check(std::string* err) const {
  auto fail = [&](const std::string& why) {
    *err = "config " + name + ": " + why;
    return false;
  };
  if (pattern.empty() || pattern.find_first_not_of("KM") != std::string::npos)
    return fail("pattern must be made of K and M");
  if (group <= 0 || group % 16) return fail("group must be a positive multiple of 16");
  for (int k : {hidden, kda_dim(), kv_lora, mla_o_dim(), moe_inter})
    if (k % group) return fail("every W4A16 input dimension must be a multiple of the group size");
  for (int n : {hidden, kda_dim(), mla_q_dim(), kv_a_dim(), kv_b_dim(), moe_inter})
    if (n % 16) return fail("every W4A16 output dimension must be a multiple of 16");
  if (qk_rope % 2) return fail("qk_rope must be even");
  if (n_active > n_experts || n_active <= 0) return fail("n_active must be in 1..n_experts");
  if (short_conv != 4) return fail("the conv window is fixed at 4 (3 kept rows + the new one)");
  return true;
}

json KimiConfig::to_json() const {
  json tc = json::array();
  for (auto [c, s] : timed_contexts) tc.push_back({c, s});
  return {{"name", name},           {"hidden", hidden},         {"kda_heads", kda_heads},
          {"kda_head_dim", kda_head_dim}, {"short_conv", short_conv}, {"mla_heads", mla_heads},
          {"kv_lora", kv_lora},     {"qk_nope", qk_nope},       {"qk_rope", qk_rope},
          {"v_head", v_head},       {"rope_theta", rope_theta}, {"n_experts", n_experts},
          {"n_active", n_active},   {"n_shared", n_shared},     {"moe_inter", moe_inter},
          {"routed_scaling", routed_scaling}, {"group", group}, {"pattern", pattern},
          {"validate_contexts", validate_contexts}, {"timed_contexts", tc}};
}

bool KimiConfig::from_json(const json& j, KimiConfig* out, std::string* err) {
  try {
    KimiConfig c;
    c.name = j.value("name", std::string("custom"));
    c.hidden = j.at("hidden");
    c.kda_heads = j.at("kda_heads");
    c.kda_head_dim = j.at("kda_head_dim");
    c.short_conv = j.value("short_conv", 4);
    c.mla_heads = j.at("mla_heads");
    c.kv_lora = j.at("kv_lora");
    c.qk_nope = j.at("qk_nope");
    c.qk_rope = j.at("qk_rope");
    c.v_head = j.at("v_head");
    c.rope_theta = j.value("rope_theta", 10000.0);
    c.n_experts = j.at("n_experts");
    c.n_active = j.at("n_active");
    c.n_shared = j.value("n_shared", 1);
    c.moe_inter = j.at("moe_inter");
    c.routed_scaling = j.value("routed_scaling", 2.446);
    c.group = j.value("group", 128);
    if (j.contains("pattern")) {
      if (j["pattern"].is_string()) {
        c.pattern = j["pattern"];
      } else {
        c.pattern.clear();
        for (auto& p : j["pattern"]) c.pattern += p.get<std::string>();
      }
    }
    if (j.contains("validate_contexts")) c.validate_contexts = j["validate_contexts"].get<std::vector<int>>();
    if (j.contains("timed_contexts")) {
      c.timed_contexts.clear();
      for (auto& p : j["timed_contexts"]) c.timed_contexts.push_back({p.at(0), p.at(1)});
    }
    if (!c.check(err)) return false;
    *out = c;
    return true;
  } catch (const std::exception& e) {
    *err = std::string("bad config: ") + e.what();
    return false;
  }
}

bool KimiConfig::preset(const std::string& size, KimiConfig* out, std::string* err) {
  KimiConfig c;
  c.name = size;
  if (size == "full") {
    // the defaults above are the spec's sizes
  } else if (size == "small" || size == "top8") {
    c.hidden = 512;
    c.kda_heads = 4;
    c.mla_heads = 4;
    c.kv_lora = 256;
    c.n_experts = 32;
    c.n_active = 8;
    c.moe_inter = 256;
    c.validate_contexts = {64, 300};
    c.timed_contexts = {{256, 8}, {1024, 8}};
  } else if (size == "tiny") {
    c.hidden = 256;
    c.kda_heads = 2;
    c.mla_heads = 2;
    c.kv_lora = 128;
    c.n_experts = 16;
    c.n_active = 4;
    c.moe_inter = 128;
    c.validate_contexts = {5, 130};
    c.timed_contexts = {{130, 4}};
  } else {
    *err = "unknown size '" + size + "' (expected full, small, tiny or top8)";
    return false;
  }
  if (!c.check(err)) return false;
  *out = c;
  return true;
}

}  // namespace ktune::kimi

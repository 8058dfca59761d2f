// The host (CPU) Kimi kernels, end to end with the real compiler: the
// baseline and megakernel templates are rendered for a config, built by g++
// through the build cache, loaded like the runner loads them and stepped on
// the runner's thread pool. They must reproduce the golden vectors of the
// independent implementation (cosine >= 0.9999, same experts) and match the
// oracle on the "small" config for knob combinations that together use
// every value of every knob; the megakernel must make exactly one parallel
// region per step. The test also prints one step's time of each on "small".
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>

#include "base/bf16.h"
#include "base/clock.h"
#include "base/fs.h"
#include "kernels/kimi/golden.h"
#include "kernels/kimi/templates.h"
#include "measure/device_args.h"
#include "measure/host_runtime.h"
#include "measure/loaded_variant.h"
#include "sandbox/build_cache.h"
#include "variants/templates.h"

using namespace ktune;
using namespace ktune::kimi;

namespace {

// One build cache for the whole run, in a temporary directory removed at
// exit, so a variant needed by two test cases is compiled once.
struct TestCache {
  std::string dir;
  std::unique_ptr<sandbox::BuildCache> cache;
  TestCache() {
    std::string err;
    if (make_temp_dir("/tmp", "ktune-host-kernels-", &dir, &err)) cache = std::make_unique<sandbox::BuildCache>(dir);
  }
  ~TestCache() {
    if (!dir.empty()) remove_tree(dir);
  }
};

sandbox::BuildCache& build_cache() {
  static TestCache c;
  REQUIRE(c.cache);
  return *c.cache;
}

// A built and loaded host variant with its zeroed scratch.
struct HostVariant {
  std::string label;
  measure::LoadedVariant lib;
  std::unique_ptr<uint8_t, decltype(&std::free)> scratch{nullptr, &std::free};
};

struct VariantSpec {
  std::string templ;  // "kimi-mega-host" or "kimi-base-host"
  json knobs = json::object();
  std::string label;
};

// Renders and builds every spec (in parallel; the cache serializes equal
// ones), then loads each one.
std::vector<std::unique_ptr<HostVariant>> build_variants(const KimiConfig& cfg, const std::vector<VariantSpec>& specs) {
  std::vector<sandbox::BuildRequest> reqs(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const variants::Template* t = find_template(specs[i].templ);
    REQUIRE(t);
    std::map<std::string, std::string> defines = config_defines(cfg);
    for (auto& [k, v] : variants::knob_defines(t->space, specs[i].knobs)) defines[k] = v;
    const std::string* body = variants::embedded_file(t->file);
    REQUIRE(body);
    std::string err;
    REQUIRE_MESSAGE(variants::render_source(defines, *body, &reqs[i].source, &err), err);
    reqs[i].source_name = "variant.cc";
    reqs[i].artifact_name = "variant.so";
    reqs[i].command = {"g++", "-std=c++17", "-O2", "-shared", "-fPIC", "-pthread", "-o", "{out}", "-x", "c++", "{src}"};
    reqs[i].compiler_id = "g++ (measure_host_kernels_test)";
    reqs[i].timeout_s = 120;
  }
  std::vector<sandbox::BuildResult> results(specs.size());
  std::vector<std::thread> builders;
  for (size_t i = 0; i < specs.size(); ++i)
    builders.emplace_back([&, i] { results[i] = build_cache().build(reqs[i]); });
  for (auto& b : builders) b.join();
  std::vector<std::unique_ptr<HostVariant>> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    INFO(specs[i].label);
    REQUIRE_MESSAGE(results[i].ok, results[i].log);
    auto v = std::make_unique<HostVariant>();
    v->label = specs[i].label;
    std::string err;
    REQUIRE_MESSAGE(v->lib.load(results[i].artifact, config_signature(cfg), &err), err);
    REQUIRE_MESSAGE(bool(v->lib.host_step()), "the variant exports no ktune_host_step");
    size_t bytes = (size_t(v->lib.scratch_bytes()) + 63) / 64 * 64;
    v->scratch.reset(static_cast<uint8_t*>(std::aligned_alloc(64, std::max<size_t>(bytes, 64))));
    REQUIRE(v->scratch);
    std::memset(v->scratch.get(), 0, bytes);
    out.push_back(std::move(v));
  }
  return out;
}

// One step of a loaded variant on `state` (advanced in place, as the oracle
// advances it), with its outputs gathered as the oracle reports them.
bool run_step(HostVariant& v, measure::HostRuntime& rt, const KimiWeights& w, KimiState* st,
              const std::vector<uint16_t>& token, StepOutput* out, std::string* err) {
  const KimiConfig& cfg = w.cfg;
  KimiDeviceArgs args{};
  if (!measure::bind_weights(w, &args, err)) return false;
  measure::bind_state(cfg, st, &args);
  std::vector<uint16_t> hidden(cfg.hidden, 0x7fc0);  // poisoned: every element must be written
  std::vector<int> topk(size_t(cfg.layers()) * cfg.n_active, -1);
  std::vector<uint16_t> attn(size_t(cfg.layers()) * cfg.attn_out_stride(), 0x7fc0);  // likewise
  std::vector<uint16_t> logits(size_t(cfg.layers()) * cfg.n_experts, 0x7fc0);         // likewise
  args.x_in = token.data();
  args.x_out = hidden.data();
  args.topk_out = topk.data();
  args.attn_out = attn.data();
  args.logits_out = logits.data();
  args.scratch = v.scratch.get();
  if (int rc = v.lib.host_step()(&args, rt.abi()); rc != 0) {
    *err = v.label + ": ktune_host_step returned " + std::to_string(rc);
    return false;
  }
  out->hidden = hidden;
  out->topk.assign(cfg.layers(), {});
  out->ckv_row.assign(cfg.layers(), {});
  out->krope_row.assign(cfg.layers(), {});
  out->attn_out.assign(cfg.layers(), {});
  out->router_logits.assign(cfg.layers(), {});
  for (int i = 0; i < cfg.layers(); ++i) {
    for (int e = 0; e < cfg.n_experts; ++e) out->router_logits[i].push_back(bf16_to_float(logits[size_t(i) * cfg.n_experts + e]));
    out->topk[i].assign(topk.begin() + i * cfg.n_active, topk.begin() + (i + 1) * cfg.n_active);
    const auto row = attn.begin() + size_t(i) * cfg.attn_out_stride();
    out->attn_out[i].assign(row, row + cfg.attn_out_dim(i));
    if (cfg.is_kda(i)) continue;
    const LayerState& L = st->layers[i];
    size_t pos = size_t(st->context);
    out->ckv_row[i].assign(L.c_kv.begin() + pos * cfg.kv_lora, L.c_kv.begin() + (pos + 1) * cfg.kv_lora);
    out->krope_row[i].assign(L.k_rope.begin() + pos * cfg.qk_rope, L.k_rope.begin() + (pos + 1) * cfg.qk_rope);
  }
  st->context += 1;
  return true;
}

int pool_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

void check_golden(const std::string& file, HostVariant& v, measure::HostRuntime& rt, const GoldenFile& g) {
  std::vector<GoldenCheck> checks;
  std::string err;
  for (auto& c : g.cases) {
    StepFn step = [&](KimiState* st, const std::vector<uint16_t>& tok, StepOutput* out, std::string* e) {
      return run_step(v, rt, g.weights, st, tok, out, e);
    };
    GoldenOptions strict;  // cosine >= 0.9999, experts in the same order, each step from the last one's outputs
    strict.min_cosine = 0.9999;
    REQUIRE_MESSAGE(check_golden_case(g, c, step, strict, &checks, &err), err);
  }
  std::map<std::string, double> worst;  // per kind of output
  int failed = 0;
  for (auto& ch : checks) {
    std::string kind = ch.name.substr(ch.name.rfind('.') + 1);
    worst.try_emplace(kind, 1.0);
    worst[kind] = std::min(worst[kind], ch.sim.cosine);
    if (!ch.ok) {
      ++failed;
      std::printf("  FAIL %s %s cos=%.6f rel_l2=%.3g\n", v.label.c_str(), ch.name.c_str(), ch.sim.cosine,
                  ch.sim.rel_l2);
    }
  }
  std::printf("golden %s, %s: %zu checks;", file.c_str(), v.label.c_str(), checks.size());
  for (auto& [k, c] : worst) std::printf(" %s>=%.7f", k.c_str(), c);
  std::printf("\n");
  CHECK_MESSAGE(failed == 0, v.label << " on " << file);
}

// Cosine of a candidate against its reference; NaN or Inf anywhere in the
// candidate (an element left unwritten, say) counts as cosine 0.
double cosine_bf16(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  if (a.size() != b.size()) return 0;
  Similarity sim = similarity(a.size(), [&](size_t i) {
    return std::pair{double(bf16_to_float(a[i])), double(bf16_to_float(b[i]))};
  });
  return sim.nonfinite ? 0 : sim.cosine;
}

double cosine_f32(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  Similarity sim = similarity(a.size(), [&](size_t i) { return std::pair{double(a[i]), double(b[i])}; });
  return sim.nonfinite ? 0 : sim.cosine;
}

// The candidate's step against the oracle's from the same state: the worst
// cosine over hidden, attention outputs, router logits, S, windows and new cache rows;
// experts must agree.
double compare_with_oracle(const KimiConfig& cfg, const KimiState& want_st, const StepOutput& want,
                           const KimiState& got_st, const StepOutput& got, bool* same_experts) {
  double worst = cosine_bf16(got.hidden, want.hidden);
  *same_experts = got.topk == want.topk;
  for (int i = 0; i < cfg.layers(); ++i) {
    const LayerState &a = got_st.layers[i], &b = want_st.layers[i];
    worst = std::min({worst, cosine_bf16(got.attn_out[i], want.attn_out[i]),
                      cosine_f32(got.router_logits[i], want.router_logits[i])});
    if (cfg.is_kda(i)) {
      worst = std::min({worst, cosine_f32(a.S, b.S), cosine_bf16(a.cq, b.cq), cosine_bf16(a.ck, b.ck),
                        cosine_bf16(a.cv, b.cv)});
    } else {
      worst = std::min({worst, cosine_bf16(got.ckv_row[i], want.ckv_row[i]),
                        cosine_bf16(got.krope_row[i], want.krope_row[i])});
    }
  }
  return worst;
}

// Median seconds of one step at the state's context (each run from a fresh
// copy of the state, so every step does the same work).
double median_step_seconds(HostVariant& v, measure::HostRuntime& rt, const KimiWeights& w, const KimiState& st,
                           const std::vector<uint16_t>& token, int runs) {
  std::vector<double> times;
  for (int r = 0; r < runs; ++r) {
    KimiState s = st;
    StepOutput out;
    std::string err;
    double t0 = mono_seconds();
    bool ok = run_step(v, rt, w, &s, token, &out, &err);
    times.push_back(mono_seconds() - t0);
    REQUIRE_MESSAGE(ok, err);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

TEST_CASE("host baseline and megakernel reproduce the golden vectors") {
  std::string dir = find_golden_dir();
  if (dir.empty()) {
    MESSAGE("SKIPPED: golden vectors not found (set KTUNE_GOLDEN_DIR or put shared/golden beside the checkout)");
    return;
  }
  measure::HostRuntime rt(pool_threads());
  for (const char* file : {"kimi-tiny.safetensors", "kimi-top8.safetensors"}) {
    GoldenFile g;
    std::string err;
    REQUIRE_MESSAGE(g.load(dir + "/" + file, &err), err);
    auto vs = build_variants(g.weights.cfg, {{"kimi-base-host", json::object(), "baseline"},
                                             {"kimi-mega-host", json::object(), "megakernel (default knobs)"}});
    for (auto& v : vs) check_golden(file, *v, rt, g);
  }
}

TEST_CASE("host megakernel knob combinations match the oracle on small, in one parallel region") {
  KimiConfig cfg;
  std::string err;
  REQUIRE(KimiConfig::preset("small", &cfg, &err));
  KimiWeights w;
  w.cfg = cfg;
  REQUIRE_MESSAGE(generate_weights(cfg, 11, &w.file, &err), err);
  REQUIRE_MESSAGE(w.bind(&err), err);

  // Together these use every value of every knob (threads up to 4).
  std::vector<VariantSpec> specs = {
      {"kimi-base-host", json::object(), "baseline"},
      {"kimi-mega-host", json::object(), "mega defaults"},
      {"kimi-mega-host",
       {{"threads", 1}, {"tile", 16}, {"barrier", "blocking"}, {"dequant", "direct"}, {"mla", "absorbed"}, {"unroll", 1}},
       "mega t1 tile16 blocking direct absorbed u1"},
      {"kimi-mega-host",
       {{"threads", 4}, {"tile", 32}, {"barrier", "spin"}, {"dequant", "direct"}, {"mla", "exact"}, {"unroll", 4}},
       "mega t4 tile32 spin direct exact u4"},
      {"kimi-mega-host",
       {{"threads", 2}, {"tile", 128}, {"barrier", "blocking"}, {"dequant", "lut"}, {"mla", "absorbed"}, {"unroll", 4}},
       "mega t2 tile128 blocking lut absorbed u4"},
      {"kimi-mega-host",
       {{"threads", 4}, {"tile", 256}, {"barrier", "spin"}, {"dequant", "direct"}, {"mla", "absorbed"}, {"unroll", 2}},
       "mega t4 tile256 spin direct absorbed u2"},
  };
  auto vs = build_variants(cfg, specs);

  const int context = 300;
  KimiState st0 = make_state(cfg, 5, context);
  std::vector<uint16_t> token = make_token(cfg, 5);
  KimiState want_st = st0;
  StepOutput want;
  oracle_step(w, &want_st, token.data(), &want);

  // A pool of 4 threads, so that the threads knob really gets 4.
  measure::HostRuntime rt(std::max(4, pool_threads()));
  for (auto& v : vs) {
    INFO(v->label);
    KimiState st = st0;
    StepOutput got;
    rt.reset_launches();
    REQUIRE_MESSAGE(run_step(*v, rt, w, &st, token, &got, &err), err);
    long launches = rt.launches();
    bool same_experts = false;
    double cos = compare_with_oracle(cfg, want_st, want, st, got, &same_experts);
    std::printf("small ctx %d, %s: worst cosine %.7f, same experts %s, %ld parallel regions per step\n", context,
                v->label.c_str(), cos, same_experts ? "yes" : "no", launches);
    CHECK(cos >= 0.999);
    CHECK(same_experts);
    if (v->label == "baseline") CHECK(launches > 20);
    else CHECK(launches == 1);
  }

  // One step of each on the machine's own threads: median of a few runs.
  measure::HostRuntime native(pool_threads());
  double base_s = median_step_seconds(*vs[0], native, w, st0, token, 9);
  double mega_s = median_step_seconds(*vs[1], native, w, st0, token, 9);
  double best_s = mega_s;
  std::string best = vs[1]->label;
  for (size_t i = 2; i < vs.size(); ++i) {
    double s = median_step_seconds(*vs[i], native, w, st0, token, 9);
    std::printf("small ctx %d, %d threads: %s %.2f ms\n", context, native.threads(), vs[i]->label.c_str(), s * 1e3);
    if (s < best_s) best_s = s, best = vs[i]->label;
  }
  std::printf("small ctx %d, %d threads: baseline %.2f ms, megakernel (defaults) %.2f ms (%.1fx); fastest %s %.2f ms\n",
              context, native.threads(), base_s * 1e3, mega_s * 1e3, base_s / mega_s, best.c_str(), best_s * 1e3);
  CHECK(mega_s < base_s);
}

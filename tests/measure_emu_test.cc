// The CUDA megakernel and baseline, compiled for the CPU emulator and run
// through the runner's emu backend, against the golden vectors and the
// oracle. This is how the CUDA kernels' logic is checked without a GPU.
#include <doctest/doctest.h>

#include <cstdio>

#include "base/bf16.h"
#include "base/compare.h"
#include "base/fs.h"
#include "kernels/kimi/golden.h"
#include "kernels/kimi/templates.h"
#include "measure/backend_hostmem.h"
#include "measure/golden_check.h"
#include "measure/validate.h"
#include "sandbox/build_cache.h"

using namespace ktune;

namespace {

// Renders a CUDA template for the emulator and builds it with g++.
std::string build_emu(const kimi::KimiConfig& cfg, const std::string& tmpl, const json& knobs) {
  const variants::Template* t = kimi::find_template(tmpl);
  REQUIRE(t);
  auto defines = kimi::config_defines(cfg);
  for (auto& [k, v] : variants::knob_defines(t->space, t->space.complete(knobs))) defines[k] = v;
  std::string src, err;
  REQUIRE_MESSAGE(variants::render_source(defines, "#include \"kernels/emu/cuda_emu.h\"\n" +
                                                       *variants::embedded_file(t->file), &src, &err), err);
  sandbox::BuildCache cache(join_path(cache_dir(), "test-builds"));
  sandbox::BuildRequest req;
  req.source = src;
  req.source_name = "variant.cc";
  req.artifact_name = "variant.so";
  req.command = {"g++", "-std=c++17", "-O1", "-w", "-shared", "-fPIC", "-o", "{out}", "-x", "c++", "{src}"};
  req.compiler_id = "g++";
  req.timeout_s = 600;
  sandbox::BuildResult r = cache.build(req);
  REQUIRE_MESSAGE(r.ok, r.log);
  return r.artifact;
}

void golden_through_emu(const std::string& file, const json& knobs, const std::string& tmpl = "kimi-mega-cuda") {
  std::string dir = kimi::find_golden_dir();
  if (dir.empty()) {
    MESSAGE("SKIPPED: golden vectors not found (set KTUNE_GOLDEN_DIR)");
    return;
  }
  kimi::GoldenFile g;
  std::string err;
  REQUIRE_MESSAGE(g.load(dir + "/" + file, &err), err);
  std::string so = build_emu(g.weights.cfg, tmpl, knobs);
  measure::EmuBackend be(g.weights.cfg);
  REQUIRE_MESSAGE(be.init(g.weights, 512, &err), err);
  REQUIRE_MESSAGE(be.load(so, &err), err);
  kimi::GoldenOptions opts;
  opts.experts_as_set = true;
  opts.refeed = true;
  measure::GoldenSummary sum;
  REQUIRE_MESSAGE(measure::check_golden_file(be, g, opts, &sum, &err), err);
  std::printf("emu %s %s %s: %s\n", tmpl.c_str(), file.c_str(), knobs.dump().c_str(), sum.describe().c_str());
  for (auto& f : sum.failures) std::printf("  FAIL %s\n", f.c_str());
  CHECK(sum.failed == 0);
  if (tmpl == "kimi-mega-cuda") CHECK(sum.launches == 1);
  else CHECK(sum.launches > 100);
}

}  // namespace

TEST_CASE("emulated CUDA megakernel reproduces golden kimi-tiny (mma)") {
  golden_through_emu("kimi-tiny.safetensors", {{"threads", 128}});
}

TEST_CASE("emulated CUDA megakernel reproduces golden kimi-top8 across knobs") {
  // Odd SM counts exercise uneven splits, several attention chunks and
  // tiles finished by another block than the one that started them.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"threads", 256}});
  golden_through_emu("kimi-top8.safetensors", {{"threads", 128}, {"dequant", "fma"}, {"stages", 0}, {"unroll", 1}});
  golden_through_emu("kimi-top8.safetensors", {{"threads", 128}, {"stages", 2}, {"barrier", "counter"}, {"attn_heads", 32}});
  setenv("KTUNE_EMU_SMS", "5", 1);
  golden_through_emu("kimi-top8.safetensors",
                     {{"threads", 512}, {"unroll", 8}, {"waves", 4}, {"attn_heads", 4}, {"load_hint", "plain"},
                      {"prefetch", 0}, {"barrier", "coop"}, {"stages", 0}});
  golden_through_emu("kimi-top8.safetensors", {{"threads", 512}, {"waves", 2}, {"stages", 6}, {"barrier", "counter"}});
  golden_through_emu("kimi-top8.safetensors", {{"early", 0}, {"barrier", "atomic"}});
  unsetenv("KTUNE_EMU_SMS");
}

TEST_CASE("emulated CUDA baseline reproduces golden kimi-tiny and kimi-top8") {
  golden_through_emu("kimi-tiny.safetensors", json::object(), "kimi-base-cuda");
  golden_through_emu("kimi-top8.safetensors", json::object(), "kimi-base-cuda");
}

TEST_CASE("emulated CUDA megakernel with many heads per warp matches the oracle") {
  // 16 MLA heads in one attention item over 4 warps: 4 heads per warp, and
  // a context long enough for several row tiles per chunk.
  kimi::KimiConfig cfg;
  std::string err;
  REQUIRE(kimi::KimiConfig::preset("tiny", &cfg, &err));
  cfg.name = "tiny-wide";
  cfg.mla_heads = 16;
  kimi::KimiWeights w;
  w.cfg = cfg;
  REQUIRE_MESSAGE(kimi::generate_weights(cfg, 5, &w.file, &err), err);
  REQUIRE_MESSAGE(w.bind(&err), err);
  std::string so = build_emu(cfg, "kimi-mega-cuda", {{"threads", 128}, {"attn_heads", 16}, {"stages", 3}});
  setenv("KTUNE_EMU_SMS", "2", 1);
  measure::EmuBackend be(cfg);
  REQUIRE_MESSAGE(be.init(w, 512, &err), err);
  REQUIRE_MESSAGE(be.load(so, &err), err);
  for (int context : {0, 97, 300}) {
    measure::OracleCase ref = measure::compute_oracle_case(w, 3, context);
    kimi::KimiState st = kimi::make_state(cfg, 3, context, 512);
    REQUIRE_MESSAGE(be.put_state(st, kimi::make_token(cfg, 3), &err), err);
    REQUIRE(be.step(context, true).ok);
    kimi::StepOutput out;
    REQUIRE_MESSAGE(be.get_state(&st, &out, &err), err);
    Similarity h = similarity(out.hidden.size(), [&](size_t i) {
      return std::pair{double(bf16_to_float(out.hidden[i])), double(bf16_to_float(ref.out.hidden[i]))};
    });
    Similarity row = similarity(out.ckv_row[3].size(), [&](size_t i) {
      return std::pair{double(bf16_to_float(out.ckv_row[3][i])), double(bf16_to_float(ref.out.ckv_row[3][i]))};
    });
    std::printf("emu wide-heads context %d: hidden cos %.7f, cache row cos %.7f\n", context, h.cosine, row.cosine);
    CHECK(h.cosine >= 0.9999);
    CHECK(row.cosine >= 0.9999);
  }
  unsetenv("KTUNE_EMU_SMS");
}

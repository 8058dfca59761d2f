// Every CUDA kernel ktune ships compiles for sm_90a with nvcc, on any machine
// with the toolkit (no GPU needed): the megakernel at its default knobs and
// at every value of every knob (and the register path's own knobs), the
// baseline, and the test variants. CI has
// no GPU; this is how it knows the GPU code builds. Also: the knob settings
// the space refuses before anything is built (any two knobs moved together
// judged without a crash), and the knobs it treats as
// inert (checked against the compiler's PTX), and the flags scripts/megakernel_defines.sh
// gives the kernels built outside the renderer.
#include <doctest/doctest.h>

#include <cstdio>
#include <sstream>

#include "agent/evaluator.h"
#include "base/fs.h"
#include "base/rng.h"
#include "kernels/kimi/templates.h"
#include "sandbox/build_cache.h"
#include "sandbox/cubin_check.h"
#include "sandbox/process.h"
#include "variants/templates.h"

using namespace ktune;

namespace {

// The cuda backend and the full-size task; false, with a visible message,
// where the CUDA toolkit is missing.
bool cuda_full_size(agent::BackendSpec* spec, kimi::KimiConfig* cfg) {
  std::string err;
  if (!agent::backend_spec("cuda", spec, &err)) {
    MESSAGE("SKIPPED (no CUDA toolkit): " << err);
    return false;
  }
  REQUIRE(kimi::KimiConfig::preset("full", cfg, &err));
  return true;
}

}  // namespace

TEST_CASE("scripts/megakernel_defines.sh gives the full-size config's defines and every knob's default") {
  // ptxas_check.sh and the consumer_rate study compile the megakernel with
  // the script's flags, outside the renderer: they must be what a session
  // builds at the defaults, or those checks measure another kernel.
  kimi::KimiConfig cfg;
  std::string err;
  REQUIRE(kimi::KimiConfig::preset("full", &cfg, &err));
  const variants::Template* mega = kimi::find_template("kimi-mega-cuda");
  REQUIRE(mega);
  std::map<std::string, std::string> want = kimi::config_defines(cfg);
  for (auto& [k, v] : variants::knob_defines(mega->space, mega->space.complete(json::object()))) want[k] = v;
  sandbox::ProcessSpec spec;
  spec.argv = {"/bin/bash", std::string(KTUNE_SOURCE_DIR) + "/scripts/megakernel_defines.sh", "KT_THREADS=512"};
  spec.workdir = std::string(KTUNE_BINARY_DIR) + "/defines_script";
  spec.env = sandbox::clean_env(spec.workdir);
  spec.limits.timeout_s = 30;
  sandbox::ProcessResult r;
  REQUIRE_MESSAGE(sandbox::run_process(spec, &r, &err), err);
  REQUIRE_MESSAGE(r.ok(), r.describe() << ": " << r.err);
  std::map<std::string, std::string> got;
  std::istringstream words(r.out);
  for (std::string w; words >> w;) {
    REQUIRE_MESSAGE(w.rfind("-D", 0) == 0, w);
    const size_t eq = w.find('=');
    REQUIRE_MESSAGE(eq != std::string::npos, w);
    got[w.substr(2, eq - 2)] = w.substr(eq + 1);
  }
  // An override replaces its default; everything else is the session's.
  CHECK(got["KT_THREADS"] == "512");
  got["KT_THREADS"] = want["KT_THREADS"];
  for (auto& [k, v] : want) {
    INFO(k);
    REQUIRE(got.count(k));
    CHECK(std::stod(got[k]) == doctest::Approx(std::stod(v)));
  }
  CHECK(got.size() == want.size());
}

TEST_CASE("the CUDA megakernel's knob space refuses settings that cannot launch or do not exist") {
  const variants::Template* mega = kimi::find_template("kimi-mega-cuda");
  REQUIRE(mega);
  auto why_not = [&](const json& knobs) {
    std::string why;
    return mega->space.valid(mega->space.complete(knobs), &why) ? std::string() : why;
  };
  // Two blocks per SM fit at 4 and 8 warps (with 16-row attention tiles and
  // a ring of at most 6 stages; at 8 the loader warpgroup keeps 72
  // registers), not at 12 or 16.
  CHECK(why_not({{"blocks_per_sm", 2}, {"threads", 128}, {"attn_rows", 16}, {"stages", 6}}).empty());
  CHECK(why_not({{"blocks_per_sm", 2}, {"threads", 256}, {"attn_rows", 16}, {"stages", 4}, {"loader_regs", 72}})
            .empty());
  CHECK(why_not({{"blocks_per_sm", 2}, {"threads", 128}, {"attn_rows", 16}}).find("stages <= 6") != std::string::npos);
  CHECK(why_not({{"blocks_per_sm", 2}, {"threads", 384}, {"attn_rows", 16}, {"stages", 4}}).find("threads <= 256") !=
        std::string::npos);
  CHECK(why_not({{"blocks_per_sm", 2}, {"threads", 512}, {"attn_rows", 16}, {"stages", 4}}).find("threads <= 256") !=
        std::string::npos);
  CHECK(why_not({{"blocks_per_sm", 2}, {"threads", 256}, {"stages", 4}}).find("attn_rows 32") != std::string::npos);
  CHECK(why_not({{"threads", 384}}).empty());
  // A bulk-fed ring is a multiple of the consumer warp groups deep (8 / n
  // warps a group at feed_chunks n): 12 warps in 3 groups, or 8 warps a
  // stage each in 8.
  CHECK(why_not({{"threads", 384}, {"stages", 8}}).find("multiple of the warp groups") != std::string::npos);
  CHECK(why_not({{"feed_chunks", 8}}).find("multiple of the warp groups") != std::string::npos);
  CHECK(why_not({{"feed_chunks", 8}, {"stages", 16}}).empty());
  CHECK(why_not({{"feed_chunks", 4}}).empty());
  CHECK(why_not({{"threads", 384}, {"stages", 8}, {"feed", "cp_async"}}).empty());
  // The light warps are groups too (3 with the consumers' 2 at feed_chunks
  // 2, 12 at 8), and come only with the loader at 8 consumer warps and one
  // block an SM (a 512-thread block's registers), whole groups of them.
  CHECK(why_not({{"light_warps", 4}}).empty());
  CHECK(why_not({{"light_warps", 4}, {"feed_chunks", 4}}).empty());
  CHECK(why_not({{"light_warps", 4}, {"feed_chunks", 8}}).empty());
  CHECK(why_not({{"light_warps", 4}, {"stages", 16}}).find("multiple of the warp groups") != std::string::npos);
  CHECK(why_not({{"light_warps", 4}, {"feed_chunks", 1}}).find("light_warps") != std::string::npos);
  CHECK(why_not({{"light_warps", 4}, {"threads", 128}, {"stages", 6}}).find("light_warps") != std::string::npos);
  CHECK(why_not({{"light_warps", 4}, {"feed", "next"}}).find("light_warps") != std::string::npos);
  CHECK(why_not({{"light_warps", 4}, {"blocks_per_sm", 2}, {"attn_rows", 16}, {"stages", 6}}).find("light_warps") !=
        std::string::npos);
  // The loader warpgroup keeps fewer registers than the launch gives a
  // thread: 168 at one block an SM, 80 with two 384-thread blocks (so the
  // default 88 needs 72 there), 128 with two 256-thread ones.
  CHECK(why_not({{"loader_regs", 72}}).empty());
  CHECK(why_not({{"blocks_per_sm", 2}, {"attn_rows", 16}, {"stages", 6}}).find("loader_regs") != std::string::npos);
  CHECK(why_not({{"loader_regs", 72}, {"blocks_per_sm", 2}, {"attn_rows", 16}, {"stages", 6}}).empty());
  CHECK(why_not({{"blocks_per_sm", 2}, {"threads", 128}, {"attn_rows", 16}, {"stages", 6}}).empty());
  // The warps must form whole groups: 4 warps cannot share a stage 8 ways
  // (this divided by zero groups and crashed a GPU session, 2026-12-04),
  // nor 12 warps (the kernel's static_assert); 16 warps make 2 groups.
  CHECK(why_not({{"threads", 128}, {"feed_chunks", 1}}).find("whole groups") != std::string::npos);
  CHECK(why_not({{"threads", 384}, {"feed_chunks", 1}}).find("whole groups") != std::string::npos);
  CHECK(why_not({{"threads", 512}, {"feed_chunks", 1}}).empty());
  CHECK(why_not({{"threads", 128}, {"feed_chunks", 1}, {"feed", "cp_async"}}).empty());
  // Shared memory holds one more 32-row attention tile at one block an SM
  // (beside a ring of up to 20 stages), two more only as 16-row tiles, none
  // with two blocks an SM.
  CHECK(why_not({{"attn_depth", 1}}).empty());
  CHECK(why_not({{"attn_depth", 1}, {"stages", 20}}).empty());
  CHECK(why_not({{"attn_depth", 2}}).find("attn_depth") != std::string::npos);
  CHECK(why_not({{"attn_depth", 2}, {"attn_rows", 16}}).empty());
  CHECK(why_not({{"blocks_per_sm", 2}, {"threads", 128}, {"attn_rows", 16}, {"stages", 6}, {"attn_depth", 1}})
            .find("attn_depth") != std::string::npos);
  // The lean GEMV loop has one shape.
  CHECK(why_not({{"gemv_code", "lean"}}).empty());
  CHECK(why_not({{"gemv_code", "lean"}, {"pipeline", 0}}).find("lean") != std::string::npos);
  CHECK(why_not({{"gemv_code", "lean"}, {"scales", "smem"}}).find("lean") != std::string::npos);
  // The loader warp (the default) deals the static schedule's items and
  // skips the cooperative-groups barrier; it needs the staged path and mma.
  CHECK(why_not({}).empty());
  CHECK(why_not({{"stages", 0}}).find("stages > 0") != std::string::npos);
  CHECK(why_not({{"dequant", "fma"}}).find("dequant mma") != std::string::npos);
  CHECK(why_not({{"stages", 0}, {"feed", "cp_async"}, {"dequant", "fma"}}).empty());
  CHECK(why_not({{"stages", 12}, {"feed", "loader"}, {"sched", "dynamic"}}).find("sched static") != std::string::npos);
  CHECK(why_not({{"stages", 12}, {"feed", "loader"}, {"barrier", "coop"}}).find("coop") != std::string::npos);
}

TEST_CASE("every template's knob space judges any two knobs moved together, and says why it refuses") {
  // The search proposes random points, not only one knob away from the
  // defaults: a constraint must hold for any combination. Every pair of
  // values of every two knobs (the others at their defaults), then random
  // points drawn per knob, as the search draws them.
  Rng rng(20261204);
  for (const variants::Template& t : kimi::templates()) {
    const variants::KnobSpace& space = t.space;
    const json defaults = space.defaults();
    int judged = 0, refused = 0;
    auto judge = [&](const json& p) {
      std::string why;
      const bool ok = space.valid(p, &why);
      ++judged;
      refused += !ok;
      if (!ok) CHECK_MESSAGE(!why.empty(), t.name << " refuses " << p.dump() << " without a reason");
    };
    for (size_t a = 0; a < space.knobs.size(); ++a)
      for (const json& va : space.knobs[a].values)
        for (size_t b = a + 1; b < space.knobs.size(); ++b)
          for (const json& vb : space.knobs[b].values) {
            json p = defaults;
            p[space.knobs[a].name] = va;
            p[space.knobs[b].name] = vb;
            judge(p);
          }
    for (int i = 0; i < 5000; ++i) {
      json p = json::object();
      for (const variants::Knob& k : space.knobs) p[k.name] = k.values[rng.below(k.values.size())];
      judge(p);
    }
    MESSAGE(t.name << ": " << judged << " points judged, " << refused << " refused");
    CHECK(judged > refused);
  }
}

TEST_CASE("knobs that change nothing at a point are the same variant as their defaults") {
  const variants::Template* mega = kimi::find_template("kimi-mega-cuda");
  REQUIRE(mega);
  const variants::KnobSpace& space = mega->space;
  // Under the defaults (the loader feeds a shared-memory ring), the register
  // path's loop knobs and `early` change nothing; on the register path they do.
  const json loader = space.complete(json::object());
  json moved = loader;
  moved["unroll"] = 4;
  moved["scales"] = "smem";
  moved["early"] = 0;
  CHECK(space.canonical(moved) == loader);
  CHECK(space.inert_moved(moved) == std::vector<std::string>{"unroll", "scales", "early"});
  const json registers = space.complete({{"stages", 0}, {"feed", "cp_async"}});
  json reg_moved = registers;
  reg_moved["unroll"] = 4;
  reg_moved["scales"] = "smem";
  CHECK(space.canonical(reg_moved) == reg_moved);  // active there
  reg_moved["early"] = 0;                          // no ring: early is inert
  CHECK(space.canonical(reg_moved)["early"] == 1);
  CHECK(space.canonical(reg_moved)["unroll"] == 4);
  // attn_rows only shapes the mma attention's tiles.
  json fma = space.complete({{"attn", "fma"}, {"attn_rows", 16}});
  CHECK(space.canonical(fma)["attn_rows"] == 32);
  CHECK(space.canonical(space.complete({{"attn_rows", 16}}))["attn_rows"] == 16);
  // So does attn_depth, its ring's depth.
  CHECK(space.canonical(space.complete({{"attn", "fma"}, {"attn_depth", 1}}))["attn_depth"] == 0);
  CHECK(space.canonical(space.complete({{"attn_depth", 1}}))["attn_depth"] == 1);
  // Canonical is a fixed point; an invalid or incomplete point comes back unchanged.
  CHECK(space.canonical(space.canonical(moved)) == space.canonical(moved));
  const json bad = space.complete({{"stages", 0}});  // the loader without a ring: refused
  CHECK(space.canonical(bad) == bad);
  const json partial = {{"unroll", 4}};
  CHECK(space.canonical(partial) == partial);
  // The session's variant id: one id for the inert moves, another for an active one.
  kimi::KimiConfig cfg;
  std::string err;
  REQUIRE(kimi::KimiConfig::preset("full", &cfg, &err));
  agent::BackendSpec spec;
  spec.name = "cuda";
  agent::Variant a, b, c;
  REQUIRE(agent::render_variant(cfg, spec, *mega, {}, "", &a, &err));
  REQUIRE(agent::render_variant(cfg, spec, *mega, {{"unroll", 4}, {"early", 0}}, "", &b, &err));
  REQUIRE(agent::render_variant(cfg, spec, *mega, {{"stages", 8}}, "", &c, &err));
  CHECK(a.id == b.id);
  CHECK(b.knobs["unroll"] == 2);
  CHECK(a.id != c.id);
}

TEST_CASE("knobs declared inert at a point leave the compiled kernel unchanged there (nvcc -ptx)") {
  agent::BackendSpec spec;
  kimi::KimiConfig cfg;
  std::string err;
  if (!cuda_full_size(&spec, &cfg)) return;
  const variants::Template* mega = kimi::find_template("kimi-mega-cuda");
  const variants::KnobSpace& space = mega->space;
  const sandbox::BuildRequest cubin = spec.build_request("");
  const std::string nvcc = cubin.command.empty() ? "" : cubin.command[0];
  if (nvcc.size() < 4 || nvcc.compare(nvcc.size() - 4, 4, "nvcc") != 0) {
    MESSAGE("SKIPPED (the build command is not nvcc: KTUNE_CUDA_LINK?)");
    return;
  }
  // The source with the knobs' macros exactly as given (render_variant
  // would canonicalize them first), compiled to PTX: one text per kernel.
  sandbox::BuildCache cache(join_path(cache_dir(), "builds"));
  auto ptx_of = [&](const json& point) {
    auto defines = kimi::config_defines(cfg);
    for (auto& [k, v] : variants::knob_defines(space, point)) defines[k] = v;
    std::string src, text;
    REQUIRE(variants::render_source(defines, *variants::embedded_file(mega->file), &src, &err));
    sandbox::BuildRequest r = cubin;
    r.source = src;
    r.artifact_name = "variant.ptx";
    r.command = {nvcc, "-arch=sm_90a", "-O3", "-ptx", "-o", "{out}", "{src}"};
    const sandbox::BuildResult b = cache.build(r);
    INFO(point.dump() << "\n" << b.log.substr(0, 2000));
    REQUIRE(b.ok);
    REQUIRE(read_file(b.artifact, &text, &err));
    return text;
  };
  int compared = 0;
  for (const json& base : {json::object(), json{{"attn", "fma"}}, json{{"stages", 0}, {"feed", "cp_async"}}}) {
    const json p = space.complete(base);
    std::string why;
    REQUIRE_MESSAGE(space.valid(p, &why), why);
    const std::string expected = ptx_of(p);
    for (const variants::Knob& k : space.knobs) {
      if (!k.active || k.active(p)) continue;
      for (const json& v : k.values) {
        json q = p;
        q[k.name] = v;
        if (v == p[k.name] || !space.valid(q, &why)) continue;
        INFO("at " << base.dump() << ": " << k.name << " = " << v.dump());
        CHECK(ptx_of(q) == expected);
        ++compared;
      }
    }
  }
  MESSAGE(compared << " inert knob settings compiled to the same PTX as their points' defaults");
  CHECK(compared >= 9);  // the defaults' unroll x3, pipeline, scales x2, gemv_code x2, early
}

TEST_CASE("the knob space refuses exactly the attention settings whose shared memory overflows (nvcc front end)") {
  // megakernel.cu asserts that its Smem fits sm_90's 227 KB. Where the mma
  // attention's extra tiles fit depends on the threads and the heads of a
  // pass; the constraint must agree with the compiler. A second assertion
  // that always fails, appended to the source, stops nvcc in its front end
  // (~2 s a point instead of ~10), which reports every failed assertion.
  agent::BackendSpec spec;
  kimi::KimiConfig cfg;
  std::string err;
  if (!cuda_full_size(&spec, &cfg)) return;
  const variants::Template* mega = kimi::find_template("kimi-mega-cuda");
  const sandbox::BuildRequest cubin = spec.build_request("");
  const std::string nvcc = cubin.command.empty() ? "" : cubin.command[0];
  if (nvcc.size() < 4 || nvcc.compare(nvcc.size() - 4, 4, "nvcc") != 0) {
    MESSAGE("SKIPPED (the build command is not nvcc: KTUNE_CUDA_LINK?)");
    return;
  }
  sandbox::BuildCache cache(join_path(cache_dir(), "builds"));
  int refused = 0, fits = 0;
  for (int threads : {128, 256, 384, 512})
    for (int heads : {16, 32})
      for (const json& attention : {json{{"attn_depth", 1}, {"attn_rows", 32}}, json{{"attn_depth", 2}, {"attn_rows", 16}}}) {
        json p = attention;
        p["threads"] = threads;
        p["attn_heads"] = heads;
        p = mega->space.complete(p);
        if (threads == 384) p["stages"] = 6;  // 3 warp groups (the ring's own constraint)
        std::string why;
        const bool valid = mega->space.valid(p, &why);
        auto defines = kimi::config_defines(cfg);
        for (auto& [k, v] : variants::knob_defines(mega->space, p)) defines[k] = v;
        std::string src;
        REQUIRE(variants::render_source(defines, *variants::embedded_file(mega->file), &src, &err));
        sandbox::BuildRequest r = cubin;
        r.source = src + "\nstatic_assert(sizeof(mk::Smem) == 0, \"the front end's end\");\n";
        r.artifact_name = "variant.cu.cpp.ii";
        r.command = {nvcc, "-arch=sm_90a", "-std=c++17", "-cuda", "-o", "{out}", "{src}"};
        const sandbox::BuildResult b = cache.build(r);
        const bool overflows = b.log.find("shared memory: Smem exceeds") != std::string::npos;
        size_t errors = 0;
        for (size_t at = b.log.find("error"); at != std::string::npos; at = b.log.find("error", at + 1)) ++errors;
        INFO(p.dump() << ": " << (valid ? "valid" : why) << "\n" << b.log.substr(0, 1500));
        REQUIRE(b.log.find("the front end's end") != std::string::npos);
        CHECK(errors == (overflows ? 3u : 2u));  // each failed assertion and the count line: no other error
        CHECK(valid == !overflows);
        (valid ? fits : refused) += 1;
      }
  MESSAGE(fits << " attention settings fit, " << refused << " refused as the compiler does");
  CHECK(fits >= 4);
  CHECK(refused >= 2);
}

TEST_CASE("all CUDA kernels compile for sm_90a") {
  agent::BackendSpec spec;
  kimi::KimiConfig cfg;
  std::string err;
  if (!cuda_full_size(&spec, &cfg)) return;
  const variants::Template* mega = kimi::find_template("kimi-mega-cuda");
  // The defaults, then each knob moved to each of its other values (a point
  // the constraints forbid is skipped: the session never builds it). Then
  // the register path (stages 0, the cp.async feed), with each knob that
  // only it reads moved the same way.
  std::vector<json> points = {json::object()};
  for (const variants::Knob& k : mega->space.knobs)
    for (const json& v : k.values)
      if (v != k.default_value) points.push_back({{k.name, v}});
  const json registers = {{"stages", 0}, {"feed", "cp_async"}};
  points.push_back(registers);
  points.push_back({{"feed", "cp_async"}, {"early", 0}});  // the ring without the loader: early is live
  points.push_back({{"attn_parts", 2}, {"attn_chains", 2}});  // two chains need the hi + lo parts
  for (const variants::Knob& k : mega->space.knobs) {
    if (k.name != "unroll" && k.name != "pipeline" && k.name != "scales" && k.name != "gemv_code" &&
        k.name != "load_hint" && k.name != "dequant")
      continue;
    for (const json& v : k.values)
      if (v != k.default_value) {
        json p = registers;
        p[k.name] = v;
        points.push_back(p);
      }
  }
  struct Job {
    std::string what;
    std::string source;
  };
  std::vector<Job> jobs;
  for (const json& p : points) {
    std::string why;
    if (!mega->space.valid(mega->space.complete(p), &why)) continue;
    agent::Variant v;
    REQUIRE_MESSAGE(agent::render_variant(cfg, spec, *mega, p, "", &v, &err), err);
    jobs.push_back({"megakernel " + p.dump(), v.source});
  }
  agent::Variant base;
  REQUIRE(agent::render_variant(cfg, spec, *kimi::find_template("kimi-base-cuda"), {}, "", &base, &err));
  jobs.push_back({"baseline", base.source});
  for (const char* f : {"cuda_fault.cu", "cuda_hang.cu", "cuda_prepare.cu"}) {
    std::string text;
    REQUIRE(read_file(std::string(KTUNE_SOURCE_DIR) + "/tests/data/" + f, &text, &err));
    agent::Variant v;
    REQUIRE(agent::render_variant(cfg, spec, *mega, {}, text, &v, &err));
    jobs.push_back({f, v.source});
  }
  sandbox::BuildCache cache(join_path(cache_dir(), "builds"));
  int built = 0;
  for (const Job& j : jobs) {
    sandbox::BuildResult r = cache.build(spec.build_request(j.source));
    INFO(j.what << "\n" << r.log.substr(0, 3000));
    CHECK(r.ok);
    built += r.ok;
    if (r.ok && r.resources.contains("registers"))
      std::printf("  %-60s %3d registers, %d bytes spilled\n", j.what.substr(0, 60).c_str(),
                  r.resources.value("registers", 0), r.resources.value("spill_stores", 0));
  }
  std::printf("compiled %d CUDA kernels for sm_90a\n", built);
}

TEST_CASE("the fma attention's copies avoid the LDGSTS form ptxas 13.0.88 mis-encoded, and a build with it is refused") {
  // At threads 256 with the cp.async feed, ptxas 13.0.88 encoded some of
  // the fma attention's rope-key copies, which carried an L2 policy, in the
  // form sandbox/cubin_check.h describes: the step died with an illegal
  // instruction (RESULTS, runs 299-302; 3 of 8 random such points).
  // AttTile::kRopeHint loads those keys plainly. Put back, the policy
  // brings the form back, and the CUDA backend's build refuses it. With
  // another ptxas this checks only that the form stays out of these
  // points' code.
  agent::BackendSpec spec;
  kimi::KimiConfig cfg;
  std::string err;
  if (!cuda_full_size(&spec, &cfg)) return;
  const variants::Template* mega = kimi::find_template("kimi-mega-cuda");
  const json fault = {{"attn", "fma"}, {"attn_heads", 32}, {"waves", 4}, {"feed", "cp_async"}, {"reduce", "atomic"}};
  json heads8 = fault;
  heads8["attn_heads"] = 8;
  sandbox::BuildCache cache(join_path(cache_dir(), "builds"));
  agent::Variant v;
  for (const json& p : {fault, heads8}) {
    INFO(p.dump());
    REQUIRE_MESSAGE(agent::render_variant(cfg, spec, *mega, p, "", &v, &err), err);
    sandbox::BuildResult r = cache.build(spec.build_request(v.source));
    INFO(r.log.substr(0, 3000));
    REQUIRE(r.ok);
    std::string cubin;
    REQUIRE(read_file(r.artifact, &cubin, &err));
    std::vector<sandbox::Instruction> step;  // the step's kernel (ktune_k1 is the prepare launch)
    for (const auto& [name, code] : sandbox::cubin_kernels(cubin))
      if (name == "ktune_k0") step = code;
    const sandbox::CopyForms forms = sandbox::count_copy_forms(step);
    std::printf("  %s: %zu instructions, %d LDGSTS, %d in the uniform-address form\n", p.dump().c_str(), step.size(),
                forms.ldgsts, forms.uniform_address);
    CHECK(step.size() > 1000);
    CHECK(forms.ldgsts > 100);  // the attention's and the GEMV ring's copies are there to be looked at
    CHECK(forms.uniform_address == 0);
  }

  const sandbox::BuildRequest plain = spec.build_request(v.source);
  if (!plain.refuse_ldgsts_defect) {
    MESSAGE("the refusal is not checked: " << plain.compiler_id.substr(0, 200) << " is not CUDA 13.0");
    return;
  }
  const std::string unhinted = "static constexpr int kRopeHint = 0;";
  const size_t at = v.source.find(unhinted);
  REQUIRE(at != std::string::npos);
  std::string hinted = v.source;
  hinted.replace(at, unhinted.size(), "static constexpr int kRopeHint = KT_CACHE_HINT;");
  sandbox::BuildResult refused = cache.build(spec.build_request(hinted));
  INFO(refused.log.substr(refused.log.size() > 3000 ? refused.log.size() - 3000 : 0));
  CHECK_FALSE(refused.ok);
  CHECK(refused.log.find("[ktune: error: the build is refused: ") != std::string::npos);
  CHECK(refused.log.find("compiled to the LDGSTS form that ptxas 13.0 mis-encodes") != std::string::npos);
  CHECK(refused.log.find(" in ktune_k0 (") != std::string::npos);
}

TEST_CASE("KTUNE_CUDA_LINK=separate builds the megakernel by separate compilation and nvlink") {
  agent::BackendSpec spec;
  kimi::KimiConfig cfg;
  std::string err;
  if (!cuda_full_size(&spec, &cfg)) return;
  agent::Variant v;
  REQUIRE_MESSAGE(agent::render_variant(cfg, spec, *kimi::find_template("kimi-mega-cuda"), {}, "", &v, &err), err);
  setenv("KTUNE_CUDA_LINK", "separate", 1);  // read when the build request is made
  sandbox::BuildRequest req = spec.build_request(v.source);
  unsetenv("KTUNE_CUDA_LINK");
  sandbox::BuildCache cache(join_path(cache_dir(), "builds"));
  sandbox::BuildResult r = cache.build(req);
  INFO(r.log.substr(0, 3000));
  REQUIRE(r.ok);
  // nvlink's output is a linked (ET_EXEC) cubin the driver loads as it is;
  // nvcc -rdc alone leaves a relocatable one (ET_REL).
  std::string cubin;
  REQUIRE(read_file(r.artifact, &cubin, &err));
  REQUIRE(cubin.size() > 18);
  CHECK(cubin.compare(0, 4, "\x7f" "ELF") == 0);
  CHECK(static_cast<unsigned char>(cubin[16]) == 2);
  // The build is keyed by its command: the default (one program) is another build.
  CHECK(spec.build_request(v.source).command != req.command);
}

// Shared by the tests of the runner and its backends: rendering a CUDA
// source (or one of the CUDA templates at some knobs) with a config's sizes
// (and any more #defines) and building it with g++ into a shared library
// the cuda-emu backend loads; starting a runner
// process; and what tests/data/cuda_prepare.cu (a variant with a prepare
// table) should give, on the emulator and on the GPU alike.
#pragma once
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "base/fs.h"
#include "kernels/kimi/state.h"
#include "kernels/kimi/templates.h"
#include "kernels/kimi/weights.h"
#include "measure/runner_backend.h"
#include "measure/runner_client.h"
#include "sandbox/build_cache.h"
#include "variants/templates.h"

namespace ktune::measure::testing {

// Renders `body` (a CUDA source; its #include "kernels/..." lines are
// inlined) after `defines` for the emulator and builds it; the library's path.
inline std::string build_emu_source(const std::map<std::string, std::string>& defines, const std::string& body) {
  std::string src, err;
  REQUIRE_MESSAGE(variants::render_source(defines, "#include \"kernels/emu/cuda_emu.h\"\n" + body, &src, &err), err);
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

// Renders the CUDA template `tmpl` at `knobs` (plus `extra` source after it,
// and test-only macros `more`) for the emulator and builds it with g++.
inline std::string build_emu(const kimi::KimiConfig& cfg, const std::string& tmpl, const json& knobs,
                             const std::string& extra = "", const std::map<std::string, std::string>& more = {}) {
  const variants::Template* t = kimi::find_template(tmpl);
  REQUIRE(t);
  auto defines = kimi::config_defines(cfg);
  for (auto& [k, v] : variants::knob_defines(t->space, t->space.complete(knobs))) defines[k] = v;
  for (auto& [k, v] : more) defines[k] = v;
  return build_emu_source(defines, *variants::embedded_file(t->file) + extra);
}

// A file of tests/data.
inline std::string test_data(const std::string& name) {
  std::string text, err;
  REQUIRE_MESSAGE(read_file(std::string(KTUNE_SOURCE_DIR) + "/tests/data/" + name, &text, &err), err);
  return text;
}

// Starts `client` on a ktune-runner process (the executable `runner`) for
// `backend` and the config preset `size`, its directory and log in `work`.
inline void start_runner(RunnerClient* client, const std::string& runner, const std::string& backend,
                         const std::string& size, const std::string& work) {
  RunnerOptions ro;
  ro.runner = runner;
  ro.backend = backend;
  ro.size = size;
  ro.workdir = work + "/runner";
  ro.log_path = work + "/runner.log";
  std::string err;
  REQUIRE_MESSAGE(client->start(ro, &err), err);
}

// The weights of `cfg` for `seed`, generated in memory.
inline kimi::KimiWeights generated_weights(const kimi::KimiConfig& cfg, uint64_t seed) {
  kimi::KimiWeights w;
  std::string err;
  w.cfg = cfg;
  REQUIRE_MESSAGE(kimi::generate_weights(cfg, seed, &w.file, &err), err);
  REQUIRE_MESSAGE(w.bind(&err), err);
  return w;
}

// What cuda_prepare.cu's prepare kernel k1 computes: the sum of the first
// 64 bytes of layer 0's router.
inline unsigned prepare_router_sum(const kimi::KimiWeights& w) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(w.layers[0].moe.router);
  unsigned sum = 0;
  for (int i = 0; i < 64; ++i) sum += bytes[i];
  return sum;
}

// Words as text, so a failed check shows them.
inline std::string words(const std::vector<unsigned>& w) {
  std::string s;
  for (unsigned v : w) s += (s.empty() ? "" : " ") + std::to_string(v);
  return s;
}

// One step of cuda_prepare.cu at `context` (fresh state and token when
// `fresh`, else the previous step's output as input): the scratch words
// its step copied into x_out. The step is one launch, whatever the prepare
// table holds.
inline std::string step_words(RunnerBackend& be, const kimi::KimiConfig& cfg, int context, bool fresh = true) {
  std::string err;
  if (fresh) REQUIRE_MESSAGE(be.put_state(kimi::make_state(cfg, 1, context, 512), kimi::make_token(cfg, 1), &err), err);
  StepStatus s = be.step(context, true);
  REQUIRE_MESSAGE(s.ok, s.error);
  CHECK(s.launches == 1);
  kimi::KimiState st;
  kimi::StepOutput out;
  REQUIRE_MESSAGE(be.get_state(&st, &out, &err), err);
  return words(std::vector<unsigned>(out.hidden.begin(), out.hidden.begin() + 5));
}

}  // namespace ktune::measure::testing

// The prepare table of the variant ABI (kernels/kimi/cuda/abi.h): a CUDA
// variant built for the CPU emulator (tests/data/cuda_prepare.cu) whose
// prepare launches write functions of the weights into scratch, through the
// cuda-emu backend in this process (what prepare computed, when, how often,
// what it saw; malformed tables) and through real runner processes (a
// prepare kernel that hangs or faults is an attempt outcome).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "base/fs.h"
#include "kernels/kimi/templates.h"
#include "measure/backend_hostmem.h"
#include "measure/runner_client.h"
#include "tests/measure_fixture.h"

using namespace ktune;
using measure::testing::build_emu_source;
using measure::testing::prepare_router_sum;
using measure::testing::step_words;
using measure::testing::test_data;
using measure::testing::words;

namespace {

kimi::KimiConfig tiny() {
  kimi::KimiConfig cfg;
  std::string err;
  REQUIRE(kimi::KimiConfig::preset("tiny", &cfg, &err));
  return cfg;
}

// tests/data/cuda_prepare.cu with prepare table `mode` (see there), built
// for the emulator.
std::string build_prepare_variant(const kimi::KimiConfig& cfg, int mode, int abi = KT_ABI_VERSION) {
  auto defines = kimi::config_defines(cfg);
  defines["KT_TEST_PREPARE"] = std::to_string(mode);
  defines["KT_TEST_ABI"] = std::to_string(abi);
  return build_emu_source(defines, test_data("cuda_prepare.cu"));
}

// The tiny config's weights (seed 5) made resident in an emulator backend.
struct TinyEmu {
  kimi::KimiConfig cfg = tiny();
  kimi::KimiWeights w = measure::testing::generated_weights(cfg, 5);
  measure::EmuBackend be{cfg};
  std::string err;
  TinyEmu() { REQUIRE_MESSAGE(be.init(w, 512, &err), err); }
};

}  // namespace

TEST_CASE("a variant's prepare table runs once per load, in order, before the first step, on the weights alone") {
  TinyEmu t;
  const kimi::KimiConfig& cfg = t.cfg;
  const kimi::KimiWeights other = measure::testing::generated_weights(cfg, 6);
  const unsigned sum = prepare_router_sum(t.w), other_sum = prepare_router_sum(other);
  REQUIRE(sum != 0);
  REQUIRE(other_sum != sum);
  measure::EmuBackend& be = t.be;
  std::string& err = t.err;
  REQUIRE_MESSAGE(be.load(build_prepare_variant(cfg, 1), &err), err);
  CHECK(be.declared_launches() == 1);
  // {router sum, prepare runs, steps, 2 * sum + 1 (k2 after k1), 1: prepare saw no step arguments}
  CHECK(step_words(be, cfg, 5) == words({sum, 1, 1, 2 * sum + 1, 1}));
  CHECK(step_words(be, cfg, 6, false) == words({sum, 1, 2, 2 * sum + 1, 1}));  // not again per step
  // Loaded again after steps (the state's pointers were bound): zeroed
  // scratch, prepared once more, still blind to the state.
  REQUIRE_MESSAGE(be.load(build_prepare_variant(cfg, 1), &err), err);
  CHECK(step_words(be, cfg, 5) == words({sum, 1, 1, 2 * sum + 1, 1}));
  // Other weights made resident: prepared again, from them.
  REQUIRE_MESSAGE(be.init(other, 512, &err), err);
  CHECK(step_words(be, cfg, 5) == words({other_sum, 1, 1, 2 * other_sum + 1, 1}));
  // The same variant without a prepare table: scratch as zeroed.
  REQUIRE_MESSAGE(be.load(build_prepare_variant(cfg, 0), &err), err);
  CHECK(step_words(be, cfg, 5) == words({0, 0, 1, 0, 0}));
}

TEST_CASE("a malformed prepare table or a failed prepare launch is a load error that says which") {
  TinyEmu t;
  const kimi::KimiConfig& cfg = t.cfg;
  const kimi::KimiWeights& w = t.w;
  measure::EmuBackend& be = t.be;
  std::string& err = t.err;
  struct Case {
    int mode;
    std::string error;
  };
  for (const Case& c : {Case{2, "ktune_num_prepare = -1 is out of range (0..64)"},
                        Case{3, "ktune_num_prepare = 65 is out of range (0..64)"},
                        Case{7, "ktune_num_prepare = 1 but the variant does not export ktune_prepare"},
                        Case{6, "prepare launch 1 (ktune_k2) failed: emulator: block size 2048 is not a multiple of "
                                "32 in 32..1024"}}) {
    CAPTURE(c.mode);
    err.clear();
    CHECK_FALSE(be.load(build_prepare_variant(cfg, c.mode), &err));
    CHECK(err == c.error);
    CHECK_FALSE(be.faulted());
    // Nothing stays loaded.
    CHECK_FALSE(be.step(5, false).ok);
  }
  REQUIRE_MESSAGE(be.load(build_prepare_variant(cfg, 1), &err), err);
  CHECK(step_words(be, cfg, 5) == words({prepare_router_sum(w), 1, 1, 2 * prepare_router_sum(w) + 1, 1}));
}

TEST_CASE("a prepare kernel that hangs is a timeout, one that faults a device_fault, and the runner goes on") {
  const kimi::KimiConfig cfg = tiny();
  const std::string hang = build_prepare_variant(cfg, 4), fault = build_prepare_variant(cfg, 5),
                    good = build_prepare_variant(cfg, 1),
                    step_hang = build_emu_source(kimi::config_defines(cfg), test_data("cuda_hang.cu"));
  std::string err, work;
  REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-prepare-test-", &work, &err), err);
  measure::RunnerClient runner;
  measure::testing::start_runner(&runner, std::string(KTUNE_BINARY_DIR) + "/ktune-runner", "cuda-emu", "tiny", work);
  auto load = [&](const std::string& artifact) { return runner.call({{"op", "load"}, {"artifact", artifact}}, 3); };

  // A hanging step, for comparison: loads, then its validation times out.
  measure::RunnerReply r = load(step_hang);
  REQUIRE_MESSAGE(r.ok, r.error);
  measure::RunnerReply step = runner.call(
      {{"op", "validate"}, {"cases", json::array({{{"seed", 1}, {"context", 5}}})}, {"out_dir", work + "/out"}}, 3);
  CHECK(step.outcome == "timeout");
  // A hanging prepare kernel: the load never answers, the same outcome.
  r = load(hang);
  MESSAGE("prepare hang: " << r.outcome << ": " << r.error);
  CHECK_FALSE(r.ok);
  CHECK(r.outcome == step.outcome);
  // A prepare kernel writing through x_out (null during prepare) crashes the
  // emulating runner: a device fault.
  r = load(fault);
  MESSAGE("prepare fault: " << r.outcome << ": " << r.error);
  CHECK_FALSE(r.ok);
  CHECK(r.outcome == "device_fault");
  CHECK(runner.starts() == 3);  // the first, then one after each timeout
  // A malformed table is the variant's launch_error (in a fresh runner,
  // which stays), and then a good one loads.
  r = load(build_prepare_variant(cfg, 2));
  CHECK(r.outcome == "launch_error");
  CHECK(r.error.find("ktune_num_prepare") != std::string::npos);
  r = load(good);
  REQUIRE_MESSAGE(r.ok, r.error);
  CHECK(r.body.value("declared_launches", -1) == 1);
  CHECK(runner.starts() == 4);
  runner.stop();
  remove_tree(work);
}

TEST_CASE("a megakernel whose prepare table was made for another grid, or would overflow, traps: a device_fault") {
  // The megakernel's prepare table numbers every phase's items for the
  // step's grid; a step launched on another grid would skip or repeat
  // items, so load_plans traps, as prepare_plans does before a kind's items
  // overflow the table. A trap ends the emulating runner's process (on the
  // GPU, the context): the attempt's outcome is a device fault, the trap is
  // in the runner's log, and the next load starts a fresh runner. The test
  // hooks KT_TEST_PLANS_GRID and KT_TEST_ITEMS_MAX make the two cases.
  const kimi::KimiConfig cfg = tiny();
  using measure::testing::build_emu;
  const std::string good = build_emu(cfg, "kimi-mega-cuda", json::object()),
                    other_grid = build_emu(cfg, "kimi-mega-cuda", json::object(), "", {{"KT_TEST_PLANS_GRID", "1"}}),
                    overflow = build_emu(cfg, "kimi-mega-cuda", json::object(), "", {{"KT_TEST_ITEMS_MAX", "1"}});
  std::string err, work;
  REQUIRE_MESSAGE(make_temp_dir("/tmp", "ktune-trap-test-", &work, &err), err);
  measure::RunnerClient runner;
  measure::testing::start_runner(&runner, std::string(KTUNE_BINARY_DIR) + "/ktune-runner", "cuda-emu", "tiny", work);
  auto load = [&](const std::string& artifact) { return runner.call({{"op", "load"}, {"artifact", artifact}}, 60); };
  auto validate = [&] {
    return runner.call(
        {{"op", "validate"}, {"cases", json::array({{{"seed", 1}, {"context", 5}}})}, {"out_dir", work + "/out"}}, 120);
  };
  auto traps_logged = [&] {  // the runners' log is appended to by every one started
    std::string log;
    REQUIRE_MESSAGE(read_file(work + "/runner.log", &log, &err), err);
    int n = 0;
    for (size_t at = log.find("kt_emu: a kernel thread trapped"); at != std::string::npos;
         at = log.find("kt_emu: a kernel thread trapped", at + 1))
      ++n;
    return n;
  };

  // Made for a grid one block larger: it loads (its prepare launch is
  // fine), then its step traps.
  measure::RunnerReply r = load(other_grid);
  REQUIRE_MESSAGE(r.ok, r.error);
  r = validate();
  MESSAGE("another grid: " << r.outcome << ": " << r.error);
  CHECK(r.outcome == "device_fault");
  CHECK(traps_logged() == 1);
  // A kind of phase with more items than the table holds: the prepare
  // launch traps, so the load is the device fault.
  r = load(overflow);
  MESSAGE("table overflow: " << r.outcome << ": " << r.error);
  CHECK(r.outcome == "device_fault");
  CHECK(traps_logged() == 2);
  // The runner goes on: the kernel without the hooks loads and validates.
  r = load(good);
  REQUIRE_MESSAGE(r.ok, r.error);
  r = validate();
  CHECK_MESSAGE(r.ok, r.error);
  CHECK(traps_logged() == 2);
  CHECK(runner.starts() == 3);  // the first, then one after each fault
  runner.stop();
  remove_tree(work);
}

TEST_CASE("variants of ABI versions 1 to 3 still load, outputs they lack not reported; others are refused") {
  // Sessions recorded before the prepare table (version 1), attn_out
  // (version 2) or logits_out (version 3) carry that version in their
  // sources; replaying or resuming them must still load them. What they do
  // not write goes unreported, so validation does not judge it (validate.h).
  TinyEmu t;
  const kimi::KimiConfig& cfg = t.cfg;
  measure::EmuBackend& be = t.be;
  std::string& err = t.err;
  for (int abi : {1, 2, 3, KT_ABI_VERSION}) {
    CAPTURE(abi);
    REQUIRE_MESSAGE(be.load(build_prepare_variant(cfg, 0, abi), &err), err);
    CHECK(step_words(be, cfg, 5) == words({0, 0, 1, 0, 0}));
    kimi::KimiState st;
    kimi::StepOutput out;
    REQUIRE_MESSAGE(be.get_state(&st, &out, &err), err);
    REQUIRE(out.attn_out.size() == size_t(cfg.layers()));
    REQUIRE(out.router_logits.size() == size_t(cfg.layers()));
    for (int i = 0; i < cfg.layers(); ++i) {
      CHECK(out.attn_out[i].size() == (abi < 3 ? 0u : size_t(cfg.attn_out_dim(i))));
      CHECK(out.router_logits[i].size() == (abi < 4 ? 0u : size_t(cfg.n_experts)));
    }
  }
  for (int abi : {0, KT_ABI_VERSION + 1}) {
    CAPTURE(abi);
    err.clear();
    CHECK_FALSE(be.load(build_prepare_variant(cfg, 0, abi), &err));
    CHECK(err == "variant ABI version " + std::to_string(abi) + ", runner speaks 1 to " +
                     std::to_string(KT_ABI_VERSION));
  }
}

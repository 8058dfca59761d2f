// The CUDA megakernel and baseline, compiled for the CPU emulator and run
// through the runner's emu backend, against the golden vectors and the
// oracle. This is how the CUDA kernels' logic is checked without a GPU.
#include <doctest/doctest.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <random>

#include "base/bf16.h"
#include "base/compare.h"
#include "base/fs.h"
#include "kernels/kimi/golden.h"
#include "kernels/kimi/templates.h"
#include "measure/backend_hostmem.h"
#include "measure/golden_check.h"
#include "measure/profile_trace.h"
#include "measure/validate.h"
#include "tests/measure_fixture.h"

using namespace ktune;

namespace {

using Defines = std::map<std::string, std::string>;
using measure::testing::build_emu;

// Loads a golden file; false, with a visible message, when the vectors are
// not found.
bool load_golden(const std::string& file, kimi::GoldenFile* g) {
  std::string dir = kimi::find_golden_dir();
  if (dir.empty()) {
    MESSAGE("SKIPPED: golden vectors not found (set KTUNE_GOLDEN_DIR)");
    return false;
  }
  std::string err;
  REQUIRE_MESSAGE(g->load(dir + "/" + file, &err), err);
  return true;
}

// Gives the emulator backend the golden file's weights and the variant built at `so`.
void start_emu(measure::EmuBackend& be, const kimi::GoldenFile& g, const std::string& so) {
  std::string err;
  REQUIRE_MESSAGE(be.init(g.weights, 512, &err), err);
  REQUIRE_MESSAGE(be.load(so, &err), err);
}

// The knob sets of the cases written before the loader became the default:
// the cp.async feed, and the register path unless they name stages (the
// defaults they were chosen against), so they go on testing what they did.
json cp_async_path(json knobs) {
  knobs.emplace("feed", "cp_async");
  knobs.emplace("stages", 0);
  return knobs;
}

void golden_through_emu(const std::string& file, const json& knobs, const std::string& tmpl = "kimi-mega-cuda",
                        const Defines& more = {}) {
  kimi::GoldenFile g;
  if (!load_golden(file, &g)) return;
  std::string err, so = build_emu(g.weights.cfg, tmpl, knobs, "", more);
  measure::EmuBackend be(g.weights.cfg);
  start_emu(be, g, so);
  kimi::GoldenOptions opts;
  opts.experts_as_set = true;
  opts.refeed = true;
  measure::GoldenSummary sum;
  REQUIRE_MESSAGE(measure::check_golden_file(be, g, opts, &sum, &err), err);
  std::printf("emu %s %s %s%s: %s\n", tmpl.c_str(), file.c_str(), knobs.dump().c_str(),
              more.empty() ? "" : (" " + json(more).dump()).c_str(), sum.describe().c_str());
  for (auto& f : sum.failures) std::printf("  FAIL %s\n", f.c_str());
  CHECK(sum.failed == 0);
  if (tmpl == "kimi-mega-cuda") CHECK(sum.launches == 1);
  else CHECK(sum.launches > 100);
}

// The tiny model with its MLA layer resized.
// The tiny model with another layer pattern (e.g. "KKM", "MKM").
kimi::KimiConfig tiny_pattern(const char* pattern) {
  kimi::KimiConfig cfg;
  std::string err;
  REQUIRE(kimi::KimiConfig::preset("tiny", &cfg, &err));
  cfg.name = std::string("tiny-") + pattern;
  cfg.pattern = pattern;
  REQUIRE_MESSAGE(cfg.check(&err), err);
  return cfg;
}

kimi::KimiConfig tiny_mla(const char* name, int heads, int kv_lora) {
  kimi::KimiConfig cfg;
  std::string err;
  REQUIRE(kimi::KimiConfig::preset("tiny", &cfg, &err));
  cfg.name = name;
  cfg.mla_heads = heads;
  cfg.kv_lora = kv_lora;
  return cfg;
}

// One step at contexts 0, 97 and 300 (two SMs) against the oracle: the
// output hidden and the MLA layer's new cache row.
void oracle_through_emu(const kimi::KimiConfig& cfg, const json& knobs, const char* sms = "2",
                        const Defines& more = {}) {
  std::string err;
  kimi::KimiWeights w;
  w.cfg = cfg;
  REQUIRE_MESSAGE(kimi::generate_weights(cfg, 5, &w.file, &err), err);
  REQUIRE_MESSAGE(w.bind(&err), err);
  std::string so = build_emu(cfg, "kimi-mega-cuda", knobs, "", more);
  setenv("KTUNE_EMU_SMS", sms, 1);
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
    const size_t m = cfg.pattern.rfind('M');  // the last MLA layer's new cache row
    REQUIRE(m != std::string::npos);
    Similarity row = similarity(out.ckv_row[m].size(), [&](size_t i) {
      return std::pair{double(bf16_to_float(out.ckv_row[m][i])), double(bf16_to_float(ref.out.ckv_row[m][i]))};
    });
    // The attention outputs, which the hidden's cosine barely sees on
    // random caches (RESULTS.md, "How much the validation sees of the
    // attention").
    REQUIRE(out.attn_out.size() == ref.out.attn_out.size());
    Similarity attn{1.0, 0.0, 0, 0};
    for (size_t l = 0; l < out.attn_out.size(); ++l) {
      REQUIRE(out.attn_out[l].size() == ref.out.attn_out[l].size());
      Similarity s = similarity(out.attn_out[l].size(), [&](size_t i) {
        return std::pair{double(bf16_to_float(out.attn_out[l][i])), double(bf16_to_float(ref.out.attn_out[l][i]))};
      });
      attn = {std::min(attn.cosine, s.cosine), std::max(attn.rel_l2, s.rel_l2), attn.nonfinite + s.nonfinite, 0};
    }
    // The router logits as the kernel ranked them: the oracle's, and its
    // experts their top-k.
    REQUIRE(out.router_logits.size() == size_t(cfg.layers()));
    Similarity logits{1.0, 0.0, 0, 0};
    for (int l = 0; l < cfg.layers(); ++l) {
      REQUIRE(out.router_logits[l].size() == size_t(cfg.n_experts));
      Similarity s = similarity(out.router_logits[l].size(), [&](size_t i) {
        return std::pair{double(out.router_logits[l][i]), double(ref.out.router_logits[l][i])};
      });
      logits = {std::min(logits.cosine, s.cosine), std::max(logits.rel_l2, s.rel_l2), logits.nonfinite + s.nonfinite, 0};
      CHECK(measure::topk_shortfall_ulps(out.router_logits[l], out.topk[l]) == 0.0);
    }
    std::printf("emu %s %s context %d: hidden cos %.7f, cache row cos %.7f, attention outputs worst cos %.7f "
                "rel_l2 %.5f, logits worst rel_l2 %.5f\n",
                cfg.name.c_str(), knobs.dump().c_str(), context, h.cosine, row.cosine, attn.cosine, attn.rel_l2,
                logits.rel_l2);
    CHECK(logits.nonfinite == 0);
    CHECK(logits.rel_l2 <= 0.01);
    CHECK(h.cosine >= 0.9999);
    CHECK(row.cosine >= 0.9999);
    CHECK(attn.nonfinite == 0);
    CHECK(attn.cosine >= 0.9999);
    CHECK(attn.rel_l2 <= 0.01);
  }
  unsetenv("KTUNE_EMU_SMS");
}

}  // namespace

TEST_CASE("emulated CUDA megakernel reproduces golden kimi-tiny (mma)") {
  golden_through_emu("kimi-tiny.safetensors", cp_async_path({{"threads", 128}}));
}

TEST_CASE("emulated CUDA megakernel reproduces golden kimi-top8 with the newer knobs' other values") {
  // The defaults (one shared GEMV loop, k-splits priced per block, the
  // cache marked evict-first) run in every other case; here the
  // alternatives: each phase's own inlined loop, splits in equal rounds,
  // plain cache loads, and the acquire-release hand-off (items whose k range
  // crosses segments add each segment's sums into the warp's row); then the
  // L2 prefetch of each phase's items with 16-row attention tiles.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"gemv_code", "inline"}, {"split_cost", "rounds"}, {"cache_hint", "plain"}}));
  golden_through_emu(
      "kimi-top8.safetensors",
      cp_async_path({{"handoff", "acq_rel"}, {"threads", 128}, {"dequant", "fma"}, {"scales", "smem"}, {"unroll", 4}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"attn", "fma"}, {"attn_heads", 16}, {"cache_hint", "plain"}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"prefetch", 1}, {"attn_rows", 16}}));
  // Phases numbered at the launch's start: with the next phase's first item
  // streaming behind a phase's last (feed stream), and on the register path
  // with items taken from a per-phase counter (sched dynamic).
  golden_through_emu("kimi-top8.safetensors",
                     {{"numbering", "launch"}, {"stages", 4}, {"feed", "stream"}, {"sched", "static"}});
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"numbering", "launch"}, {"sched", "dynamic"}}));
  // Items listed by the prepare table: with the next phase's first item
  // streaming behind, and taken from the counter (read from the table, not
  // the block's shared copy: the block does not know their place).
  golden_through_emu("kimi-top8.safetensors",
                     {{"numbering", "items"}, {"stages", 4}, {"feed", "stream"}, {"sched", "static"}});
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"numbering", "items"}, {"sched", "dynamic"}}));
  // KDA items started by per-head counters: published by release atomics,
  // then by fences (k-split q,k,v,g tiles finished by whichever block ends last).
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"kda_start", "heads"}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"kda_start", "heads"}, {"handoff", "fence"}, {"threads", 128}}));
  // The lean GEMV loop: clamped unpredicated loads, the edge tiles' lanes
  // streaming column 0 with zeroed scales (kimi-top8's kv_a has a partial
  // tile), on the mma and the fma dequant, at unroll 2 and 4.
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"gemv_code", "lean"}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"gemv_code", "lean"}, {"unroll", 4}, {"dequant", "fma"}, {"threads", 128}}));
  // 12 warps: KDA key rows split 11 per warp (the last warp's 7), the mma
  // attention's latent dims over 8 of the warps.
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"threads", 384}, {"gemv_code", "lean"}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"threads", 384}, {"attn", "fma"}, {"kda_start", "heads"}}));
  // o_proj's and down's sums added by atomics and finished by the next
  // phase's staging, on 3 and 32 SMs (from 1 to 8 splits per tile; several
  // items per block), and on the staged GEMV path.
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"reduce", "atomic"}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"reduce", "atomic"}, {"threads", 128}, {"stages", 2}}));
  setenv("KTUNE_EMU_SMS", "32", 1);
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"reduce", "atomic"}, {"threads", 128}, {"gemv_code", "lean"}}));
  setenv("KTUNE_EMU_SMS", "3", 1);
}

TEST_CASE("emulated CUDA megakernel with the bulk feed reproduces golden kimi-top8") {
  // The prepare table repacks every GEMV matrix into stages (kimi-top8's
  // kv_a has a partial last tile: padded columns); one thread streams them
  // through the ring by bulk copies on mbarriers, the block's next item
  // behind the current one and a phase's first stages before its barrier
  // (early). On 3 SMs: several items per block and phase; 4 warps
  // (two chunks of a stage each) with a 2-deep ring and no early issue; on
  // 32 SMs with the k-split sums added by atomics.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"stages", 4}, {"feed", "bulk"}});
  golden_through_emu("kimi-top8.safetensors", {{"stages", 2}, {"feed", "bulk"}, {"early", 0}, {"threads", 128}});
  // next: the block's next item behind the current one (32 SMs: k-split
  // tiles, several items per block); stream: also the next GEMV phase's
  // first item behind a phase's last
  // (o_proj's behind q,k,v,g across the KDA update; the next layer's
  // behind down; the MoE's shared experts behind o_proj).
  golden_through_emu("kimi-top8.safetensors", {{"stages", 16}, {"feed", "stream"}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  golden_through_emu("kimi-top8.safetensors", {{"stages", 8}, {"feed", "next"}, {"reduce", "atomic"}});
  golden_through_emu("kimi-top8.safetensors", {{"stages", 6}, {"feed", "stream"}, {"threads", 128}});
  setenv("KTUNE_EMU_SMS", "3", 1);
}

TEST_CASE("emulated CUDA megakernel with the loader warp reproduces golden kimi-top8") {
  // A fourth warpgroup's first warp walks every GEMV phase's stages of its
  // block and keeps the ring full across the grid barriers; the consumers'
  // block barriers are a named barrier without it. On 3 SMs (several items
  // per block and phase; the M layer's attention borrowing the ring's
  // memory in between), a 2-deep ring with 4 consumer warps (the loader
  // waits for a slot at nearly every stage), and on 32 SMs with k-split
  // sums added by atomics.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", json::object());  // the defaults: the loader, a 12-stage ring
  golden_through_emu("kimi-top8.safetensors", {{"stages", 2}, {"feed", "loader"}, {"threads", 128}});
  // Every kind of phase numbered once when the launch starts (4 warps: two
  // kinds a warp), the loader numbering its own.
  golden_through_emu("kimi-top8.safetensors", {{"numbering", "launch"}, {"threads", 128}});
  // Every kind numbered once by the prepare table for the step's grid
  // (its 12 blocks number for the step's 3), the loader using them too.
  golden_through_emu("kimi-top8.safetensors", {{"numbering", "prepare"}});
  // And every item listed by it: a block's first 4 of a kind from its
  // shared copy, the rest (here most: 3 blocks) from the table.
  golden_through_emu("kimi-top8.safetensors", {{"numbering", "items"}});
  // The MoE gate/up k-splits finished by the last item of each tile (the
  // defaults add them by atomics into the layer's buffer, which the layer
  // after zeroes), on 3 SMs and on 32.
  golden_through_emu("kimi-top8.safetensors", {{"moe_reduce", "last"}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  golden_through_emu("kimi-top8.safetensors", {{"stages", 8}, {"feed", "loader"}, {"reduce", "atomic"}});
  // Items listed by the prepare table, with hold (most from the shared copy here).
  golden_through_emu("kimi-top8.safetensors", {{"numbering", "items"}, {"hold", 2}});
  // The boundary helpers out of line (the gather by polling runs here:
  // phases of one item a block).
  golden_through_emu("kimi-top8.safetensors", {{"helpers", "shared"}});
  // Here (gather poll by default) the MoE gate/up's tiles meet by the
  // counter and down's, in the same partial slots, by polling.
  golden_through_emu("kimi-top8.safetensors", {{"stages", 8}, {"feed", "loader"}, {"moe_reduce", "last"}});
  setenv("KTUNE_EMU_SMS", "3", 1);
}

TEST_CASE("emulated CUDA megakernel with 4 or 8 chunks a consumer warp reproduces golden kimi-top8") {
  // feed_chunks: 8 / n warps share a stage and the groups of them take the
  // stages in turn. With the loader: 4 chunks a warp (four groups of two
  // warps over the 12-deep ring) on 3 SMs, and a warp a whole stage with 4
  // warps over a 4-deep ring (a group a slot); with the bulk feed's per-item
  // loop on 32 SMs.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"feed_chunks", 4}});
  golden_through_emu("kimi-top8.safetensors", {{"feed_chunks", 8}, {"stages", 4}, {"threads", 128}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  golden_through_emu("kimi-top8.safetensors", {{"feed_chunks", 8}, {"stages", 8}, {"feed", "next"}});
  setenv("KTUNE_EMU_SMS", "3", 1);
}

TEST_CASE("emulated CUDA megakernel with a light warpgroup eating stages reproduces golden kimi-top8") {
  // light_warps 4: a warpgroup that only eats GEMV stages, posted each item
  // by the consumers (light_go) and read back from its red rows
  // (light_done). On 3 SMs (many items a block and phase, the attention
  // borrowing the ring between them): 3 groups of 4 warps over the 12-deep
  // ring, and 6 groups of 2 (feed_chunks 4); on 32 SMs in reverse fiber
  // order (the light warps reach their waits first, and items of 1-2 stages
  // leave the light group nothing to eat), with k-split sums by atomics.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"light_warps", 4}});
  golden_through_emu("kimi-top8.safetensors", {{"light_warps", 4}, {"feed_chunks", 4}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  setenv("KTUNE_EMU_ORDER", "reverse", 1);
  golden_through_emu("kimi-top8.safetensors", {{"light_warps", 4}, {"reduce", "atomic"}});
  unsetenv("KTUNE_EMU_ORDER");
  setenv("KTUNE_EMU_SMS", "3", 1);
}

TEST_CASE("emulated CUDA megakernel with the loader's copies in flight capped reproduces golden kimi-top8") {
  // inflight n: the loader waits for its n-th last copy to land before the
  // next; on 3 SMs with the 12-deep ring (across the M layer's attention,
  // which borrows the ring), and on 32 with a 4-deep one (the cap at the
  // ring's depth: no wait beyond the slots').
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"inflight", 4}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  golden_through_emu("kimi-top8.safetensors", {{"inflight", 4}, {"stages", 4}});
  setenv("KTUNE_EMU_SMS", "3", 1);
}

TEST_CASE("emulated CUDA megakernel with the repacked stages in group order reproduces golden kimi-top8") {
  // repack_order group: a matrix's stages [groups][tiles] (top8's matrices
  // have 2-4 tiles and 2-4 groups, so every stage moves). Read by the loader
  // (its phases and the first stages prefetched at the launch's start), and
  // by feed next, whose next item's stages come from next_base and next_step.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"repack_order", "group"}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  golden_through_emu("kimi-top8.safetensors", {{"repack_order", "group"}, {"feed", "next"}, {"stages", 8}});
  setenv("KTUNE_EMU_SMS", "3", 1);
}

TEST_CASE("emulated CUDA megakernel with the loader holding back each phase's stages reproduces golden kimi-top8") {
  // hold n: a GEMV phase's stages after its first n wait for the block's
  // consumers to begin the phase. On 3 SMs (blocks with many items a phase),
  // with the numbering from the prepare table, and on 32 SMs in reverse
  // fiber order (a block with no item in a phase still counts it).
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"hold", 2}});
  golden_through_emu("kimi-top8.safetensors", {{"hold", 4}, {"numbering", "prepare"}});
  golden_through_emu("kimi-top8.safetensors", {{"hold", 1}});
  // The held stages released as the block passes the grid barrier.
  golden_through_emu("kimi-top8.safetensors", {{"hold", 1}, {"hold_release", "barrier"}});
  // hold_scope ahead: at most n stages of all the phases not begun, together.
  golden_through_emu("kimi-top8.safetensors", {{"hold", 4}, {"hold_scope", "ahead"}});
  golden_through_emu("kimi-top8.safetensors", {{"hold", 1}, {"hold_scope", "ahead"}, {"hold_release", "barrier"}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  setenv("KTUNE_EMU_ORDER", "reverse", 1);
  golden_through_emu("kimi-top8.safetensors", {{"hold", 6}});
  golden_through_emu("kimi-top8.safetensors", {{"hold", 6}, {"hold_scope", "ahead"}});
  golden_through_emu("kimi-top8.safetensors", {{"hold_release", "barrier"}});
  unsetenv("KTUNE_EMU_ORDER");
  unsetenv("KTUNE_EMU_SMS");
}

TEST_CASE("emulated CUDA megakernel with the router's logits counted or tagged reproduces golden kimi-top8") {
  // logits tagged (the default): the rankers poll words that carry their
  // validity, reset when the launch ends (each case runs two launches, so a
  // word left over from the first would rank the second's experts from
  // stale logits; in thread order the rows are always written before the
  // loader looks, so the fibers also take turns in reverse). counter:
  // router_done counts the rows, then the logits are read. With the bulk
  // feed the consumers rank, with the loader the loader.
  setenv("KTUNE_EMU_SMS", "3", 1);
  setenv("KTUNE_EMU_ORDER", "reverse", 1);
  golden_through_emu("kimi-top8.safetensors", json::object());
  unsetenv("KTUNE_EMU_ORDER");
  golden_through_emu("kimi-top8.safetensors", {{"logits", "counter"}});
  golden_through_emu("kimi-top8.safetensors", {{"logits", "tagged"}, {"feed", "bulk"}});
  golden_through_emu("kimi-top8.safetensors", {{"logits", "counter"}, {"feed", "bulk"}});
}

TEST_CASE("emulated CUDA megakernel gathering k-split partials by polling reproduces golden kimi-top8") {
  // gather poll: where a phase has one item a block, split 0 polls the
  // others' partials (marked unwritten by the prepare kernel, and again by
  // split 0 once read: each case's second launch needs the marks back). On
  // 32 SMs o_proj and down have one item a block; on 3 nothing does, so
  // every tile gathers by the counter. Fibers also in reverse order, where
  // split 0 reaches its poll before the others have written.
  setenv("KTUNE_EMU_SMS", "32", 1);
  golden_through_emu("kimi-top8.safetensors", {{"gather", "poll"}});
  setenv("KTUNE_EMU_ORDER", "reverse", 1);
  golden_through_emu("kimi-top8.safetensors", {{"gather", "poll"}, {"logits", "counter"}});
  unsetenv("KTUNE_EMU_ORDER");
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"gather", "poll"}});
}

TEST_CASE("emulated CUDA megakernel with the phases' inputs as tagged words reproduces golden kimi-top8") {
  // flow tagged: no grid barrier before o_proj, the MoE gate/up and a
  // layer's first phase; their staging polls the attention output, h and x
  // as words tagged with the launch and the layer. With KT_FLOW_LATE every
  // writer yields before its word, so the polls come first (with the polls
  // removed, 155 of 228 checks fail). On 3 SMs the k-splits gather by
  // counters, on 32 by polling: both alternate halves between consecutive
  // phases.
  setenv("KTUNE_EMU_SMS", "3", 1);
  setenv("KTUNE_EMU_ORDER", "reverse", 1);
  golden_through_emu("kimi-top8.safetensors", {{"flow", "tagged"}}, "kimi-mega-cuda", {{"KT_FLOW_LATE", "1"}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  golden_through_emu("kimi-top8.safetensors", {{"flow", "tagged"}});
  unsetenv("KTUNE_EMU_ORDER");
  setenv("KTUNE_EMU_SMS", "3", 1);
  // tagged_o: o_proj's input only (the M layer's w_uv and o_proj then also meet without a barrier).
  golden_through_emu("kimi-top8.safetensors", {{"flow", "tagged_o"}}, "kimi-mega-cuda", {{"KT_FLOW_LATE", "1"}});
}

TEST_CASE("emulated CUDA megakernel with the down phase started per gate/up tile reproduces golden kimi-top8") {
  // down_start tiles: no grid barrier before the MoE down phase; each down
  // item waits until the gate/up tiles of its k range have all their
  // chunks' sums in. With KT_DOWN_LATE every gate/up item yields before it
  // adds its sums, so the down items reach their waits first; on 3 SMs a
  // block has several gate/up and down items, on 32 the fibers also take
  // turns in reverse.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"down_start", "tiles"}}, "kimi-mega-cuda", {{"KT_DOWN_LATE", "1"}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  setenv("KTUNE_EMU_ORDER", "reverse", 1);
  golden_through_emu("kimi-top8.safetensors", {{"down_start", "tiles"}, {"kda_start", "heads"}}, "kimi-mega-cuda",
                     {{"KT_DOWN_LATE", "1"}});
  unsetenv("KTUNE_EMU_ORDER");
  setenv("KTUNE_EMU_SMS", "3", 1);
  // The cp.async path (no loader), where gate/up and down stage their own weights.
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"down_start", "tiles"}}), "kimi-mega-cuda",
                     {{"KT_DOWN_LATE", "1"}});
}

TEST_CASE("emulated CUDA megakernel with tagged inputs and one or three layers matches the oracle") {
  // flow tagged zeroes the spent gate/up sums after the layer's one grid
  // barrier; with three layers the next launch's layer 0 zeroes the buffer
  // the last launch's last layer used. With one layer every tagged word is
  // layer 0's in every launch (only the launch in the tag tells them apart;
  // the fibers' schedule never lets a poll overtake its writer here, so a
  // tag without the launch passes too). Three steps in a row on 2 SMs.
  for (const char* pattern : {"KKM", "M"}) {
    setenv("KTUNE_EMU_ORDER", "reverse", 1);
    oracle_through_emu(tiny_pattern(pattern), {{"flow", "tagged"}}, "2", {{"KT_FLOW_LATE", "1"}});
    unsetenv("KTUNE_EMU_ORDER");
  }
}

TEST_CASE("emulated CUDA megakernel with the MoE routing predicted reproduces golden kimi-top8") {
  // predict top8 / top9: the loader warpgroup's spare warps predict the
  // router's logits as tagged words in parts (reset when the launch ends;
  // each case runs two launches), every block's loader streams the
  // predicted experts' gate/up, and the routing finds its 8 among them.
  // With KT_PREDICT_FIX 0 a missed prediction is not repaired, so those
  // cases pass only if every layer's routing was within the prediction.
  // KT_PREDICT_MISS drops the predicted best expert, so every layer misses
  // and takes the fix phase (a grid barrier, then all 8 experts' gate/up
  // again). In reverse fiber order the loaders poll before the predictor
  // warps have written.
  const Defines strict = {{"KT_PREDICT_FIX", "0"}}, miss = {{"KT_PREDICT_MISS", "1"}};
  setenv("KTUNE_EMU_SMS", "3", 1);
  setenv("KTUNE_EMU_ORDER", "reverse", 1);
  golden_through_emu("kimi-top8.safetensors", {{"predict", "top9"}}, "kimi-mega-cuda", strict);
  golden_through_emu("kimi-top8.safetensors", {{"predict", "top8"}}, "kimi-mega-cuda", miss);
  unsetenv("KTUNE_EMU_ORDER");
  setenv("KTUNE_EMU_SMS", "32", 1);
  // top8: the golden vectors' routing is not within the predicted top 8
  // somewhere (with KT_PREDICT_FIX 0, 8 of 228 checks fail), so the fix
  // phase runs in some layers and not in others.
  golden_through_emu("kimi-top8.safetensors", {{"predict", "top8"}});
  golden_through_emu("kimi-top8.safetensors", {{"predict", "top8"}, {"predict_stream", "after_landed"}});
  golden_through_emu("kimi-top8.safetensors", {{"predict", "top9"}, {"moe_reduce", "last"}}, "kimi-mega-cuda", miss);
  golden_through_emu("kimi-top8.safetensors", {{"predict", "top9"}, {"numbering", "launch"}}, "kimi-mega-cuda", miss);
  // The fix phase's numbering from the prepare table too (on 32 SMs).
  golden_through_emu("kimi-top8.safetensors", {{"predict", "top9"}, {"numbering", "prepare"}}, "kimi-mega-cuda", miss);
  golden_through_emu("kimi-top8.safetensors", {{"predict", "top9"}, {"numbering", "items"}}, "kimi-mega-cuda", miss);
  unsetenv("KTUNE_EMU_SMS");
}

TEST_CASE("emulated CUDA megakernel streaming across phases never names a routed tile before this layer's routing") {
  // stream names the MoE phase's first item during o_proj. A block whose
  // first gate/up item is a routed tile must not stream it with the
  // previous layer's experts. kimi-top8 never has such a block (its o_proj
  // has fewer items than its first routed gate/up item's index); here, at
  // 12 SMs, the K layers' o_proj (2 tiles of 8 groups) has an item on every
  // block while the router's 2 row items and the shared expert's 4 lead
  // items leave blocks 6 to 11 a routed tile first.
  kimi::KimiConfig cfg;
  std::string err;
  REQUIRE(kimi::KimiConfig::preset("tiny", &cfg, &err));
  cfg.name = "tiny-deep-oproj";
  cfg.kda_heads = 8;
  REQUIRE_MESSAGE(cfg.check(&err), err);
  oracle_through_emu(cfg, {{"stages", 4}, {"feed", "stream"}}, "12");
  // The loader warp reaches those routed tiles as early as it can: it must
  // wait for this block's routing of the layer.
  oracle_through_emu(cfg, {{"stages", 4}, {"feed", "loader"}}, "12");
}

TEST_CASE("emulated CUDA megakernel with an odd number of layers starts every launch's gate/up sums at zero") {
  // The MoE gate/up items add their sums into one of two buffers (by the
  // layer's parity), and each buffer is zeroed after its down phase read it.
  // With three layers the next launch's layer 0 takes the buffer the last
  // layer used: three steps in a row (one launch each) against the oracle.
  oracle_through_emu(tiny_pattern("KKM"), {{"moe_reduce", "atomic"}});
}

TEST_CASE("emulated profiled megakernel stamps every block's arrival at each grid barrier") {
  kimi::GoldenFile g;
  if (!load_golden("kimi-tiny.safetensors", &g)) return;
  const kimi::KimiConfig& cfg = g.weights.cfg;
  std::string err, so = build_emu(cfg, "kimi-mega-cuda", {{"threads", 128}, {"profile", 1}});
  setenv("KTUNE_EMU_SMS", "3", 1);
  measure::EmuBackend be(cfg);
  start_emu(be, g, so);
  REQUIRE_MESSAGE(be.set_trace(measure::profile_trace_words(), &err), err);
  REQUIRE_MESSAGE(be.put_state(kimi::make_state(cfg, 1, 5, 512), kimi::make_token(cfg, 1), &err), err);
  REQUIRE(be.step(5, false).ok);
  std::vector<uint64_t> t;
  REQUIRE_MESSAGE(be.read_trace(&t, &err), err);
  unsetenv("KTUNE_EMU_SMS");
  // One record per barrier and per routing event block 0 stamped (points 12,
  // 2-5 and 14-15), in that order; every block writes each barrier's and
  // most events; the router-row event only blocks with router rows, the
  // first routed item's two only blocks with a routed item.
  auto is_event = [](int point) { return (point >= 2 && point <= 5) || point == 14 || point == 15; };
  std::vector<int> points;
  for (const json& s : measure::trace_stamps(t)) {
    const int tag = s[0].get<int>(), point = (tag - 1024) % 16;
    if (tag >= 1024 && (point == 12 || is_event(point))) points.push_back(point);
  }
  json arrivals = measure::barrier_arrivals(t);
  CHECK(std::count(points.begin(), points.end(), 12) >= 4 * 4);  // at least four barriers per layer
  for (int event : {2, 3, 4, 5, 14, 15}) CHECK(std::count(points.begin(), points.end(), event) == cfg.layers());
  REQUIRE(arrivals.size() == points.size());
  uint64_t previous_last = 0;
  for (size_t k = 0; k < points.size(); ++k) {
    const json& a = arrivals[k];
    const uint64_t first = a[0], median = a[1], last = a[2], p90 = a[4];
    CHECK(first <= median);
    CHECK(median <= p90);
    CHECK(p90 <= last);
    CHECK(a[3].get<int>() >= 0);
    CHECK(a[3].get<int>() < 3);
    CHECK(first >= previous_last);  // nobody passes before everyone arrived at the barrier before
    int stamped = 0;
    for (int b = 0; b < 512; ++b) stamped += t[1024 + k * 512 + b] != 0;
    if (points[k] == 3 || points[k] == 14 || points[k] == 15)
      CHECK(stamped >= 1);  // the blocks with router rows, or with a routed item
    else
      CHECK(stamped == 3);
    if (points[k] == 12) previous_last = last;
  }
}

TEST_CASE("emulated CUDA megakernel reproduces golden kimi-top8 with k-splits priced per block") {
  // 16 blocks: the MoE's row items and shared-expert splits fill the first
  // wave, and the routed tiles' split changes with the model.
  setenv("KTUNE_EMU_SMS", "16", 1);
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"lead", 1}}));
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"lead", 0}, {"waves", 2}, {"handoff", "acq_rel"}}));
}

TEST_CASE("emulated CUDA megakernel reproduces golden kimi-top8 across knobs") {
  // Odd SM counts exercise uneven splits, several attention chunks and
  // tiles finished by another block than the one that started them.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"threads", 256}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"threads", 256}, {"pipeline", 1}, {"scales", "smem"}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"threads", 256}, {"scales", "ahead"}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"threads", 128}, {"pipeline", 1}, {"unroll", 4}, {"scales", "ahead"}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"threads", 128}, {"pipeline", 1}, {"unroll", 1}, {"dequant", "fma"}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"threads", 128}, {"dequant", "fma"}, {"stages", 0}, {"unroll", 1}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"threads", 128}, {"stages", 2}, {"barrier", "counter"}, {"attn_heads", 32}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"threads", 128}, {"attn", "mma"}, {"attn_heads", 16}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"attn_rows", 32}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"threads", 128}, {"attn_heads", 32}, {"attn_rows", 32}}));
  setenv("KTUNE_EMU_SMS", "5", 1);
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"threads", 512},
                                                             {"unroll", 8},
                                                             {"waves", 4},
                                                             {"attn_heads", 4},
                                                             {"load_hint", "plain"},
                                                             {"prefetch", 0},
                                                             {"barrier", "coop"},
                                                             {"stages", 0}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"threads", 512}, {"waves", 2}, {"stages", 6}, {"barrier", "counter"}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"early", 0}, {"barrier", "atomic"}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"threads", 512}, {"attn", "mma"}, {"attn_heads", 4}, {"stages", 4}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"threads", 512}, {"attn_heads", 4}, {"attn_rows", 32}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"attn", "mma"}, {"blocks_per_sm", 2}, {"attn_rows", 16}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"threads", 512}, {"waves", 4}, {"scales", "smem"}, {"unroll", 2}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"sched", "dynamic"}, {"waves", 4}, {"lead", 1}}));
  golden_through_emu("kimi-top8.safetensors",
                     cp_async_path({{"lead", 1}, {"stages", 2}, {"early", 1}, {"threads", 128}}));
  // 16 blocks: the shared expert's 4 tiles are cut into 3 k-splits each
  // ((16 - 4 router row items) / 4), the routed tiles otherwise.
  setenv("KTUNE_EMU_SMS", "16", 1);
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"lead", 0}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"lead", 1}}));
  golden_through_emu("kimi-top8.safetensors", cp_async_path({{"lead", 1}, {"stages", 2}, {"early", 1}}));

  unsetenv("KTUNE_EMU_SMS");
}

TEST_CASE("emulated CUDA baseline reproduces golden kimi-tiny and kimi-top8") {
  golden_through_emu("kimi-tiny.safetensors", json::object(), "kimi-base-cuda");
  golden_through_emu("kimi-top8.safetensors", json::object(), "kimi-base-cuda");
}

TEST_CASE("emulated CUDA megakernel with many heads per warp matches the oracle") {
  // 16 MLA heads in one attention item over 4 warps: 4 heads per warp (fma),
  // one m16 tile (mma), and a context long enough for several row tiles per
  // chunk, the last one partial.
  const kimi::KimiConfig cfg = tiny_mla("tiny-wide", 16, 128);
  oracle_through_emu(cfg, cp_async_path({{"threads", 128}, {"attn_heads", 16}, {"stages", 4}}));
  oracle_through_emu(cfg, cp_async_path({{"threads", 128}, {"attn_heads", 16}, {"stages", 4}, {"attn", "mma"}}));
}

TEST_CASE("emulated CUDA megakernel with mma attention at the full head count and latent width matches the oracle") {
  // 32 heads x 512 latent dims, as in the full model: over 4 warps an item
  // needs two passes of 16 heads (registers), over 8 warps one pass of two
  // m16 tiles.
  const kimi::KimiConfig cfg = tiny_mla("tiny-mla-full", 32, 512);
  oracle_through_emu(
      cfg, cp_async_path({{"threads", 128}, {"attn_heads", 32}, {"attn", "mma"}, {"sched", "dynamic"}, {"lead", 1}}));
  oracle_through_emu(cfg, cp_async_path({{"threads", 256}, {"attn_heads", 32}, {"attn", "mma"}, {"stages", 2}}));
}

namespace {

// Runs attn_phase (fma) or attn_phase_mma over layer 0's cache, alone.
const char* kAttnHarness = R"(
static void kt_attn_harness(const KimiDeviceArgs& a, const KtLaunchArgs& l) {
  mk::Ctx c{a, reinterpret_cast<mk::Scratch*>(a.scratch), reinterpret_cast<mk::Smem*>(kt_smem()), int(threadIdx.x),
            int(threadIdx.x) & 31, int(threadIdx.x) >> 5};
  if (l.a[0]) {
    if (KT_ATTN_EARLY) mk::attn_issue_first(c, a.layers[0].mla, a.context);  // as before q_abs
    mk::attn_phase_mma(c, a.layers[0].mla, a.context);
  } else {
    mk::attn_phase(c, a.layers[0].mla, a.context);
  }
}
extern "C" int attn_harness(int mma, int grid, const void* args, char* err, int errlen) {
  KtLaunchArgs l{{mma, 0, 0, 0}};
  return kt_emu::launch(+[](const void* a, const void* p) {
      kt_attn_harness(*static_cast<const KimiDeviceArgs*>(a), *static_cast<const KtLaunchArgs*>(p));
    }, unsigned(grid), KT_THREADS, sizeof(mk::Smem), true, args, &l, err, size_t(errlen));
}
extern "C" void attn_harness_layout(size_t* o) {
  o[0] = sizeof(mk::Scratch);
  o[1] = __builtin_offsetof(mk::Scratch, q_abs);
  o[2] = __builtin_offsetof(mk::Scratch, mla_q);
  o[3] = __builtin_offsetof(mk::Scratch, attn_m);
  o[4] = __builtin_offsetof(mk::Scratch, attn_l);
  o[5] = __builtin_offsetof(mk::Scratch, attn_acc);
}
)";

// The mma phase against the fma phase on random queries large enough for a
// peaked softmax (where scores matter): per (chunk, head) the same max, sum
// and weighted sum of latent rows. The mma path's bf16 hi + lo parts of the
// queries and weights carry 16 significant bits (fp32: 24), so they agree to
// a few 1e-5, not to the last bit. With attn_parts 1 (the default) they are
// bf16 alone (8 bits: up to 2^-9 relative rounding each), and these queries'
// large scores (|s| ~ 10) put the softmax's sums ~1-2% apart (the full-size
// validation's attention output moved from 0.00355 to 0.00363 relative L2,
// RESULTS run 233); a dropped row or dims step is far more.
void compare_attention(int mla_heads, int kv_lora, const json& knobs) {
  const json point = kimi::megakernel_template("cuda")->space.complete(knobs);
  const double tol = point["attn_parts"].get<int>() == 1 ? 3e-2 : 1e-4;
  const kimi::KimiConfig cfg = tiny_mla("tiny", mla_heads, kv_lora);
  std::string so = build_emu(cfg, "kimi-mega-cuda", knobs, kAttnHarness);
  void* lib = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(lib, dlerror());
  auto run = reinterpret_cast<int (*)(int, int, const void*, char*, int)>(dlsym(lib, "attn_harness"));
  auto layout = reinterpret_cast<void (*)(size_t*)>(dlsym(lib, "attn_harness_layout"));
  REQUIRE((run && layout));
  size_t off[6];
  layout(off);
  const int MH = mla_heads, R = kv_lora, QH = cfg.qk_nope + cfg.qk_rope, ROPE = cfg.qk_rope, cap = 512, grid = 5;
  std::vector<float> scratch_words(off[0] / 4 + 4, 0.0f);  // 16-byte aligned by the allocator
  uint8_t* scratch = reinterpret_cast<uint8_t*>(scratch_words.data());
  float* q_abs = reinterpret_cast<float*>(scratch + off[1]);
  uint16_t* mla_q = reinterpret_cast<uint16_t*>(scratch + off[2]);
  float* m = reinterpret_cast<float*>(scratch + off[3]);
  float* l = reinterpret_cast<float*>(scratch + off[4]);
  float* acc = reinterpret_cast<float*>(scratch + off[5]);
  std::mt19937 rng(7);
  std::normal_distribution<float> wide(0.0f, 2.0f), cache(0.0f, 0.1f);
  for (int i = 0; i < MH * R; ++i) q_abs[i] = wide(rng);
  for (int i = 0; i < MH * QH; ++i) mla_q[i] = float_to_bf16(wide(rng) * 4);
  std::vector<uint16_t> c_kv(size_t(cap) * R), k_rope(size_t(cap) * ROPE);
  for (auto& v : c_kv) v = float_to_bf16(cache(rng));
  for (auto& v : k_rope) v = float_to_bf16(cache(rng));
  KimiDeviceArgs args{};
  args.layers[0].mla.c_kv = c_kv.data();
  args.layers[0].mla.k_rope = k_rope.data();
  args.scratch = scratch;
  const int heads_per_item = std::min(knobs.value("attn_heads", 8), MH);
  for (int context : {0, 37, 300}) {
    const int rows = context + 1;
    const int nch = std::max(1, std::min({grid / (MH / heads_per_item), (rows + 3) / 4, 512}));
    const size_t slots = size_t(nch) * MH;
    std::vector<float> out[2][3];
    args.context = context;
    for (int mma = 0; mma < 2; ++mma) {
      std::fill(m, m + slots, NAN);
      std::fill(l, l + slots, NAN);
      std::fill(acc, acc + slots * R, NAN);
      char msg[256] = "";
      REQUIRE_MESSAGE(run(mma, grid, &args, msg, sizeof msg), msg);
      out[mma][0].assign(m, m + slots);
      out[mma][1].assign(l, l + slots);
      out[mma][2].assign(acc, acc + slots * R);
    }
    double worst_m = 0, worst_l = 0, worst_o = 0;
    for (size_t s = 0; s < slots; ++s) {
      const double m0 = out[0][0][s], m1 = out[1][0][s], l0 = out[0][1][s], l1 = out[1][1][s];
      REQUIRE(std::isfinite(m0));
      REQUIRE(std::isfinite(m1));
      worst_m = std::max(worst_m, std::abs(m1 - m0) / std::max(1.0, std::abs(m0)));
      // The same sum of exp(score) whatever max each subtracted.
      worst_l = std::max(worst_l, std::abs(l1 * std::exp(m1 - m0) / l0 - 1));
      double top = 0, diff = 0;
      for (int r = 0; r < R; ++r) {
        const double o0 = out[0][2][s * R + r] / l0, o1 = out[1][2][s * R + r] / l1;
        REQUIRE(std::isfinite(o1));
        top = std::max(top, std::abs(o0));
        diff = std::max(diff, std::abs(o1 - o0));
      }
      worst_o = std::max(worst_o, diff / top);
    }
    std::printf("emu attention mma vs fma, %d heads x %d dims %s context %d: max rel diff m %.2e, l %.2e, o %.2e\n",
                MH, R, knobs.dump().c_str(), context, worst_m, worst_l, worst_o);
    CHECK(worst_m < tol);
    CHECK(worst_l < tol);
    CHECK(worst_o < tol);
  }
  dlclose(lib);
}

}  // namespace

TEST_CASE("emulated CUDA megakernel's mma attention phase writes the fma phase's partials") {
  // Full-size heads and latent width: two passes of 16 heads (4 warps), two
  // m16 tiles per pass (8 warps), an item of 8 heads padded to 16 (16 warps),
  // two blocks per SM; then the tiny model's 128 dims over more warps than
  // 16-dim slices (half the warps idle in the mma steps).
  compare_attention(32, 512, cp_async_path({{"threads", 128}, {"attn_heads", 32}, {"attn", "mma"}}));
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn_heads", 32}, {"attn", "mma"}}));
  compare_attention(32, 512, cp_async_path({{"threads", 512}, {"attn_heads", 8}, {"attn", "mma"}}));
  compare_attention(
      32, 512,
      cp_async_path({{"threads", 256}, {"attn_heads", 16}, {"attn", "mma"}, {"blocks_per_sm", 2}, {"attn_rows", 16}}));
  compare_attention(2, 128, cp_async_path({{"threads", 512}, {"attn", "mma"}}));
  // Deeper rings of row tiles (attn_depth): 4 of 32 rows, 6 of 16.
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_depth", 1}}));
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_depth", 2}, {"attn_rows", 16}}));
  // The scores' hi and lo chains apart (attn_chains 2), with one m16 tile and two.
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_parts", 2}, {"attn_chains", 2}}));
  compare_attention(
      32, 512, cp_async_path({{"threads", 256}, {"attn_heads", 32}, {"attn", "mma"}, {"attn_parts", 2}, {"attn_chains", 2}}));
  // A tile's 16-row steps as loops (attn_rolled), 32- and 16-row tiles.
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_rolled", 1}}));
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_rolled", 1}, {"attn_rows", 16}}));
  // The block's first tiles issued before the phase (attn_early), with 3 and 4 tiles in the ring.
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_early", 1}}));
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_early", 1}, {"attn_rows", 16}}));
  // An item's first tile issued alone, the others once it has landed (attn_first), 32- and 16-row tiles.
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_first", 1}}));
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_first", 1}, {"attn_rows", 16}}));
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_first", 1}, {"attn_early", 1}}));
  // The cases above take the queries and probabilities as one bf16 part each
  // (attn_parts 1, the default); as hi + lo parts with one m16 tile and two,
  // 32- and 16-row tiles.
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_parts", 2}}));
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn_heads", 32}, {"attn", "mma"}, {"attn_parts", 2}}));
  compare_attention(32, 512, cp_async_path({{"threads", 256}, {"attn", "mma"}, {"attn_parts", 2}, {"attn_rows", 16}}));
}

TEST_CASE("emulated CUDA megakernel with the attention's first tiles issued early reproduces golden kimi-top8") {
  // attn_early 1: the block's first attention tiles are issued when q_abs
  // starts, with the loader (which must not refill the ring until the
  // attention is done), on 3 and 32 SMs.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"attn_early", 1}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  setenv("KTUNE_EMU_ORDER", "reverse", 1);
  golden_through_emu("kimi-top8.safetensors", {{"attn_early", 1}});
  unsetenv("KTUNE_EMU_ORDER");
  // With attn_first 1 only the first tile goes out early; the rest follow at the phase's start.
  oracle_through_emu(tiny_pattern("MKM"), {{"attn_early", 1}, {"attn_first", 1}});
  setenv("KTUNE_EMU_SMS", "3", 1);
}

TEST_CASE("emulated CUDA megakernel with the attention's tiles issued by spare warps matches golden and oracle") {
  // attn_feed spare: the loader warpgroup's spare warps issue every tile
  // from q_abs on, into the slots the block hands back, and the block waits
  // for each on its slot's mbarrier: golden kimi-top8 on 3 and 32 SMs; then
  // at contexts 0 (one row: a partial tile), 97 and 300 (more tiles than
  // slots) with one M layer and with two (the slots' count goes on across
  // attentions), the spare warps made late (KT_ATTN_LATE) so that the block
  // reaches each tile first.
  setenv("KTUNE_EMU_SMS", "3", 1);
  golden_through_emu("kimi-top8.safetensors", {{"attn_feed", "spare"}});
  setenv("KTUNE_EMU_SMS", "32", 1);
  setenv("KTUNE_EMU_ORDER", "reverse", 1);
  golden_through_emu("kimi-top8.safetensors", {{"attn_feed", "spare"}});
  unsetenv("KTUNE_EMU_ORDER");
  for (const char* pattern : {"KKM", "MKM"})
    oracle_through_emu(tiny_pattern(pattern), {{"attn_feed", "spare"}}, "2", {{"KT_ATTN_LATE", "1"}});
  // attn_first 1: the spare warps wait for an item's first tile to land before they issue the next.
  oracle_through_emu(tiny_pattern("MKM"), {{"attn_feed", "spare"}, {"attn_first", 1}}, "2", {{"KT_ATTN_LATE", "1"}});
  setenv("KTUNE_EMU_SMS", "3", 1);
}

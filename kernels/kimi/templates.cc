#include "kernels/kimi/templates.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace ktune::kimi {

using variants::Knob;
using variants::KnobSpace;
using variants::Template;

namespace {

KnobSpace cuda_mega_space() {
  KnobSpace s;
  s.knobs = {
      {"threads", "KT_THREADS", {128, 256, 384, 512}, 256, "threads per block (4, 8, 12 or 16 warps)"},
      {"blocks_per_sm", "KT_BLOCKS_PER_SM", {1, 2}, 1,
       "co-resident blocks per SM; 2 halves the register budget per thread"},
      {"barrier", "KT_BARRIER", {"atomic", "coop", "counter"}, "counter",
       "grid barrier: a counter + generation word, cooperative_groups grid.sync(), or one monotonic counter "
       "per launch (one atomic per block per barrier)"},
      {"dequant", "KT_DEQUANT", {"fma", "mma"}, "mma",
       "int4 dequant feeding fp32 FMAs, or bf16 tensor-core mma (m16n8k16)"},
      {"unroll", "KT_UNROLL", {1, 2, 4, 8}, 2,
       "register path (stages 0): 16-row chunks of 16-byte weight loads in flight per warp"},
      {"load_hint", "KT_LOAD_HINT", {"plain", "stream"}, "stream",
       "weight loads: plain (L1-cached), or streaming past L1 with an evict-first L2 policy"},
      {"prefetch", "KT_PREFETCH", {0, 1}, 0,
       "prefetch the next phase's weights into L2 before waiting at a grid barrier"},
      {"launch_prefetch", "KT_LAUNCH_PREFETCH", {0, 1}, 1,
       "with the loader warp: when it has issued the launch's last stages, it prefetches into L2 the stages "
       "its block's ring starts the next launch with (layer 0's first GEMV phase), which otherwise all come "
       "from DRAM at once while the consumers wait"},
      {"attn_heads", "KT_ATTN_HEADS", {4, 8, 16, 32}, 16, "MLA heads per attention work item"},
      {"attn", "KT_ATTN", {"fma", "mma"}, "mma",
       "attention scores and weighted sums on fp32 FMAs with warp shuffles, or on bf16 tensor-core mma "
       "(16 heads x attn_rows cached rows per tile)"},
      {"attn_rows", "KT_ATTN_ROWS", {16, 32}, 32,
       "mma attention: cached rows per shared-memory tile (two block barriers and one exchange of partial "
       "scores per tile)"},
      {"attn_depth", "KT_ATTN_DEPTH", {0, 1, 2}, 0,
       "mma attention: row tiles in its cp.async ring beyond the fitted depth (3 tiles of 32 rows, 4 of 16, 2 "
       "with two blocks an SM), so more of the latent cache is in flight per block"},
      {"pipeline", "KT_PIPELINE", {0, 1}, 1,
       "register path: issue the next batch of weight loads before computing the current one (two buffers)"},
      {"scales", "KT_SCALES", {"global", "smem", "ahead"}, "ahead",
       "register path (stages 0): GEMV scales and zeros loaded by each warp when its group changes (and waited for), copied for the "
       "whole work item into shared memory (cp.async) while the first weights load, or loaded one group "
       "ahead into registers (the first with the first weights)"},
      {"waves", "KT_WAVES", {1, 2, 4}, 1, "GEMV work items per block per phase (k-splits grow with it)"},
      {"lead", "KT_LEAD", {0, 1}, 1,
       "MoE gate/up: cut the shared expert's tiles into as many k-splits as fill the first wave, so every "
       "block streams them while the router's logits and the routing are computed"},
      {"sched", "KT_SCHED", {"static", "dynamic"}, "static",
       "GEMV work items after a block's first: round-robin by block index, or taken from a per-phase "
       "atomic counter, so blocks whose loads return sooner take more items"},
      {"stages", "KT_STAGES", {0, 2, 4, 6, 8, 12, 16, 20}, 12,
       "0: each warp loads its weights into registers; n: a block-wide n-deep ring through shared memory, one "
       "quantization group (8.5 KB) per stage, filled as knob feed says"},
      {"early", "KT_EARLY", {0, 1}, 1,
       "with stages and a feed other than loader: start streaming the next phase's weights into shared memory before waiting at the barrier"},
      {"feed", "KT_FEED", {"cp_async", "bulk", "next", "stream", "loader"}, "loader",
       "with stages: how a stage reaches shared memory: every thread copies 16-byte pieces of the weights as "
       "stored (cp.async, a block barrier per stage); or one thread copies the stage in one piece (a bulk "
       "copy on the copy engine, completion and release on mbarriers) from a copy of the weights repacked "
       "once per load (the prepare table) into stages with the nibbles laid out for the mma, each item's "
       "stages issued from its start (bulk), the block's next item's streaming behind the current one's "
       "(next), and also the next GEMV phase's first item's behind a phase's last (stream); or a fourth "
       "warpgroup whose first warp, the loader, never waits at a grid barrier, walks the block's stages of every "
       "GEMV phase of the step in order and keeps the ring full across the barriers, its registers lent to the "
       "other warps (loader)"},
      {"feed_chunks", "KT_FEED_Q", {1, 2, 4, 8}, 2,
       "with stages fed by bulk copies (a feed other than cp_async): the 16-row chunks of a stage (8 in all) each "
       "consumer warp computes, so 8 / n warps share a stage and the groups of them take the stages in turn "
       "(more chunks a warp: more stages in progress at once and a stage's scales read by fewer warps)"},
      {"light_warps", "KT_LIGHT_WARPS", {0, 4}, 0,
       "with the loader: 0, or a light warpgroup of 4 warps beside the 8 consumer warps that only eats GEMV "
       "stages (a third group of 4 warps taking an item's stages in turn, at 88 registers; the consumers keep "
       "168, or 176 at loader_regs 72, and run everything else), so 12 warps eat the stages where 12 consumer "
       "warps would spill"},
      {"loader_regs", "KT_LOADER_REGS", {72, 88}, 88,
       "with the loader: the registers a thread its warpgroup keeps (setmaxnreg), the rest lent to the consumer "
       "warps (216 or 208 at threads 256). ptxas spills less at 88 (nvcc 13.0: 8 / 116 bytes stored / loaded "
       "against 48 / 132 at 72): the spare warps' attention tile loop and the loader's own code fit, the "
       "consumers' hot loop does not change (88 measured 1-3 us a step faster on the H100: RESULTS, runs 328-330)"},
      {"inflight", "KT_INFLIGHT", {0, 4, 6, 8}, 0,
       "with the loader warp: at most n of a block's stage copies in flight (the loader waits for the n-th last "
       "to land before it issues the next), so that the weight stream queues less in front of the loads that "
       "the phases' staging, hand-offs and barriers wait for; 0: as many as the ring has free slots"},
      {"hold", "KT_HOLD", {0, 1, 2, 3, 4, 6}, 2,
       "with the loader warp and predict off: at most n of a GEMV phase's stages issued before the block's "
       "consumers begin the phase (past the grid barrier before it), the rest after, so that fewer copies are in "
       "flight while the phase boundary's hand-offs, barrier and cold code wait on L2 behind them; 0: as many "
       "as the ring has free slots"},
      {"attn_chains", "KT_ATTN_CHAINS", {1, 2}, 1,
       "mma attention: a tile's scores from the queries' bf16 hi and lo parts accumulated in one mma chain, or "
       "in two half as long (summed after), so that a warp waits less on each mma's latency"},
      {"attn_parts", "KT_ATTN_PARTS", {2, 1}, 1,
       "mma attention: the queries and the softmax's probabilities as bf16 hi + lo parts (two mmas each, ~16 "
       "significant bits) or as one bf16 part (half the mmas, 8 significant bits, as flash attention kernels "
       "take them)"},
      {"attn_rolled", "KT_ATTN_ROLLED", {0, 1}, 0,
       "mma attention: a tile's 16-row steps (scores and weighted sum) unrolled, or as loops (less code a tile, "
       "for the instruction cache)"},
      {"attn_early", "KT_ATTN_EARLY", {0, 1}, 0,
       "mma attention: a block's first cached-row tiles issued after the grid barrier that starts the attention, "
       "or in the q_abs phase before it, behind q_abs's own loads (the rows are written by then), so that their "
       "DRAM round trip overlaps q_abs"},
      {"attn_first", "KT_ATTN_FIRST", {0, 1}, 0,
       "mma attention: an item's ring of cached-row tiles issued at once, or its first tile alone and the "
       "others once it has landed (every block starts together, and the first tiles land sooner without the "
       "rest of the ring in front of them); with attn_early 1 only the first tile is issued in the q_abs phase"},
      {"attn_feed", "KT_ATTN_FEED", {"threads", "spare"}, "spare",
       "mma attention: the cached-row tiles issued by the block's threads (cp.async), or by the loader "
       "warpgroup's two spare warps (cp.async, from the q_abs phase on, into slots the block hands back), so "
       "that the block's threads never stall issuing them (with feed loader, attn_early 0 and predict off; "
       "elsewhere the block's threads issue them)"},
      {"gemv_code", "KT_GEMV_CODE", {"inline", "shared", "lean"}, "shared",
       "register path: each GEMV phase inlines its own copy of the weight loop, or all call one out-of-line "
       "copy (less code to fetch when a phase starts; a call and the sums through shared memory per segment), "
       "or one out-of-line lean copy (no zeroed or predicated loads: chunks past a warp's range clamped to "
       "its last; scales one group ahead; needs pipeline 1 and scales ahead)"},
      {"split_cost", "KT_SPLIT_COST", {"rounds", "blocks"}, "blocks",
       "how a phase's k-split is chosen: rounds of equal items x an item's cost, or each block's items "
       "summed with row items and lead tiles at their own smaller cost"},
      {"cache_hint", "KT_CACHE_HINT", {"plain", "evict_first", "evict_last"}, "evict_first",
       "attention: the latent cache rows loaded plainly (they may stay in L2 for the next step), marked "
       "first to evict from L2 (the router's rows and the KDA state stay instead), or marked last to evict "
       "(the cache stays in L2 for the next step while the weights, loaded evict-first, stream through)"},
      {"gather", "KT_GATHER", {"counter", "poll"}, "poll",
       "how a k-split tile's partial sums meet (where the phase has one item a block): every item counts "
       "itself in by an atomic and the last one reads the others' partials, or split 0 polls the others' "
       "partials (marked unwritten until they land) and adds them, one L2 round trip less"},
      {"logits", "KT_LOGITS", {"counter", "tagged"}, "tagged",
       "how the MoE router's logits reach the warps that rank them: a counter of written rows, acquired, then "
       "the logits read; or each logit written as a word that carries its own validity, polled (one L2 round "
       "trip less before the routed experts' weights can stream)"},
      {"predict", "KT_PREDICT", {"off", "top8", "top9"}, "off",
       "with the loader warp: the MoE gate/up streams the routed experts' weights once the router's logits are "
       "ranked, or from the phase's start those of the top 8 or 9 experts of a prediction that the loader "
       "warpgroup's idle warps compute during o_proj from the layer's input and the attention output (a "
       "64 x 6400 table a layer, made by the prepare kernel); the routing, computed as before, then finds its "
       "8 among them, or a fix phase computes them after a grid barrier"},
      {"predict_stream", "KT_PREDICT_STREAM", {"at_once", "after_landed"}, "at_once",
       "with predict: the loader streams the predicted experts' weights as soon as it has ranked them, or "
       "only once the stages it issued before them (o_proj's, the shared experts') have landed"},
      {"handoff", "KT_HANDOFF", {"fence", "acq_rel"}, "acq_rel",
       "a k-split item's partial sums (and, with logits counter, the router's logits): published by a fence and "
       "an atomic, or by one release (acquire-release) atomic after the block barrier"},
      {"kda_start", "KT_KDA_START", {"barrier", "heads"}, "barrier",
       "K layers: the KDA update starts after a grid barrier, or each item as soon as its head's q, k, v, g "
       "tiles and beta are published (per-head counters; the state's rows load while it waits)"},
      {"down_start", "KT_DOWN_START", {"barrier", "tiles"}, "barrier",
       "the MoE down phase starts after a grid barrier, or each down item as soon as the gate/up tiles its "
       "k range reads have all their sums in (per-tile counters of the chunks added; needs moe_reduce atomic, "
       "predict off and flow barrier)"},
      {"reduce", "KT_REDUCE", {"last", "atomic"}, "last",
       "o_proj and down k-splits: the last item of a tile (an atomic counter) sums the partials in order and "
       "adds the residual, or every item adds its sums into an fp32 vector by atomics (their order, so the "
       "last bits, vary) and the next phase's input staging adds the residual"},
      {"moe_reduce", "KT_MOE_REDUCE", {"last", "atomic"}, "atomic",
       "MoE gate/up k-splits (the shared experts' lead tiles): the last item of a tile sums the partials (an "
       "atomic counter and the others' partials on its path), or every item adds its sums into the layer's fp32 "
       "gate/up vector by atomics (their order, so the last bits, vary), which the down phase's staging reads "
       "after the barrier"},
      {"flow", "KT_FLOW", {"barrier", "tagged", "tagged_o"}, "barrier",
       "how o_proj, the MoE gate/up and a layer's first phase get their inputs (the attention output, h, x): "
       "after a grid barrier, read; or written as words that carry their own validity (value and a tag of the "
       "launch and layer) and polled by the phase's staging, with no barrier before it (one grid barrier a "
       "layer is left; tagged_o: o_proj's input only; needs feed loader, reduce last, moe_reduce atomic, "
       "predict off, kda_start barrier)"},
      {"numbering", "KT_NUMBERING", {"barrier", "launch", "prepare", "items"}, "items",
       "how a block numbers a GEMV phase's items (split_for's search): at the barrier before the phase, between "
       "its arrival and the grid's (the last block to arrive starts the phase after it; a copy of the search per "
       "phase type), or once per kind of phase when the launch starts (one copy; the loader warp numbers its "
       "own either way), or once by the prepare table, each launch copying them into shared memory (no search "
       "in the step's code, the loader's included), or that and the prepare table listing every item as well, each "
       "launch copying its block's (no item arithmetic in the step's code either)"},
      {"hold_release", "KT_HOLD_RELEASE", {"phase", "barrier"}, "phase",
       "with hold: the held stages go out when the block's consumers begin the phase's items (after its input "
       "staging), or as soon as they pass the grid barrier before it (the staging's loads then share L2 with "
       "them, and the first items wait less for DRAM)"},
      {"hold_scope", "KT_HOLD_SCOPE", {"phase", "ahead"}, "phase",
       "with hold n: at most n stages of each GEMV phase whose items the block's consumers have not begun, or "
       "at most n of all such phases together (behind a run of short phases the loader then stays n stages "
       "ahead, not a dozen)"},
      {"repack_order", "KT_REPACK_ORDER", {"tile", "group"}, "tile",
       "with a bulk feed: how the repacked copy orders a matrix's stages: each tile's groups in one run (an "
       "item's stages are one run), or each group's tiles side by side (the blocks of a phase, each on its own "
       "item, read a few runs at a time instead of one stream each)"},
      {"helpers", "KT_HELPERS", {"inline", "shared"}, "inline",
       "the helpers a phase runs once at its start or end (its input RMSNorm, the beta and router rows' dots, "
       "the k-split gather): inlined at each call site, or one out-of-line copy each, so that less code comes "
       "from L2 at each phase boundary (at the cost of a call)"},
      {"profile", "KT_PROFILE", {0, 1}, 0, "stamp each phase's start time (for the per-phase profile only)"},
  };
  // Where a knob changes nothing (its macro does not reach the compiled
  // code there), it is inert: the session then treats the point as the one
  // with that knob at its default. Checked against the compiler: the test
  // "knobs declared inert ..." builds each such point both ways and
  // compares the PTX.
  auto when = [&](const char* name, std::function<bool(const json&)> active) {
    for (Knob& k : s.knobs)
      if (k.name == name) k.active = std::move(active);
  };
  auto register_path = [](const json& p) { return p["stages"].get<int>() == 0; };
  for (const char* k : {"unroll", "pipeline", "scales", "gemv_code"}) when(k, register_path);
  when("early", [](const json& p) { return p["stages"].get<int>() > 0 && p["feed"].get<std::string>() != "loader"; });
  when("gather", [](const json& p) { return p["feed"].get<std::string>() != "cp_async"; });
  for (const char* k : {"feed_chunks", "repack_order"})
    when(k, [](const json& p) { return p["feed"].get<std::string>() != "cp_async"; });
  for (const char* k : {"launch_prefetch", "predict", "inflight", "loader_regs"})
    when(k, [](const json& p) { return p["feed"].get<std::string>() == "loader"; });
  // A prediction runs only under the loader (megakernel.cu's KT_PREDICTED);
  // the knobs below and the constraint's checks all ask it this one way.
  auto predicted = [](const json& p) {
    return p["feed"].get<std::string>() == "loader" && p["predict"].get<std::string>() != "off";
  };
  // hold counts the loader's phases as the consumers' one for one; predict's fix phase runs on some layers only.
  auto holds = [predicted](const json& p) { return p["feed"].get<std::string>() == "loader" && !predicted(p); };
  when("hold", holds);
  for (const char* k : {"hold_release", "hold_scope"})
    when(k, [holds](const json& p) { return holds(p) && p["hold"].get<int>() > 0; });
  when("predict_stream", predicted);
  for (const char* k : {"attn_rows", "attn_depth", "attn_chains", "attn_early", "attn_rolled", "attn_parts", "attn_feed",
                        "attn_first"})
    when(k, [](const json& p) { return p["attn"].get<std::string>() == "mma"; });
  // attn_feed spare needs the loader warpgroup's spare warps (under predict they are the predictor's) and
  // every tile theirs to issue (attn_early issues the first ones); elsewhere the block's threads issue them.
  when("attn_feed", [predicted](const json& p) {
    return p["attn"].get<std::string>() == "mma" && p["feed"].get<std::string>() == "loader" && !predicted(p) &&
           p["attn_early"].get<int>() == 0;
  });
  s.constraint = [predicted](const json& p, std::string* why) {
    // Two blocks of more than 8 warps do not fit an SM's registers and shared
    // memory together (the runner's occupancy check refused 2 x 384 and 2 x
    // 512 threads in GPU sessions: RESULTS, runs 90 and 101).
    if (p["threads"].get<int>() * p["blocks_per_sm"].get<int>() > 512 && p["blocks_per_sm"].get<int>() > 1) {
      *why = "blocks_per_sm 2 needs threads <= 256 (two blocks' registers and shared memory on one SM)";
      return false;
    }
    // Two blocks' shared memory: each gets ~113 KB, which a ring of more than
    // 6 stages (8.5 KB each, beside the staged input and the attention's
    // tiles) overflows (sizeof(Smem): 101 KB at 6 stages, 115 KB at 8).
    if (p["blocks_per_sm"].get<int>() > 1 && p["stages"].get<int>() > 6) {
      *why = "blocks_per_sm 2 needs stages <= 6 (two blocks' rings in shared memory)";
      return false;
    }
    // The fma attention gives each warp at most 4 of an item's heads (registers).
    if (p["attn"].get<std::string>() == "fma" && p["attn_heads"].get<int>() > 4 * (p["threads"].get<int>() / 32)) {
      *why = "attn_heads exceeds 4 heads per warp";
      return false;
    }
    // Three 32-row tiles and their scores need ~136 KB of shared memory; two blocks do not fit on an SM.
    if (p["attn"].get<std::string>() == "mma" && p["attn_rows"].get<int>() == 32 && p["blocks_per_sm"].get<int>() > 1) {
      *why = "attn_rows 32 needs blocks_per_sm 1 (shared memory)";
      return false;
    }
    // The mma attention's ring beside the rest of the block's shared memory
    // (~48 KB): one more 32-row tile (37 KB) fits at one block an SM, two do
    // not; 16-row tiles (18.5 KB) fit two more; two blocks an SM have no room.
    if (p["attn"].get<std::string>() == "mma" && p["attn_depth"].get<int>() > 0 &&
        (p["blocks_per_sm"].get<int>() > 1 || p["attn_depth"].get<int>() * p["attn_rows"].get<int>() > 32)) {
      *why = "attn_depth > 0 needs blocks_per_sm 1, and attn_depth 2 needs attn_rows 16 (shared memory)";
      return false;
    }
    // One more 32-row tile fits only beside small partial scores (AttMma's
    // part: the warps that split the latent dims x the heads of a pass):
    // 16 such warps at 512 threads, or passes of 32 heads where 8 warps'
    // registers hold them (256 threads and attn_heads 32), take 247-251 KB
    // (measured with the compiler's front end; megakernel.cu's static_assert
    // on Smem catches what this misses).
    if (p["attn"].get<std::string>() == "mma" && p["attn_depth"].get<int>() == 1 && p["attn_rows"].get<int>() == 32 &&
        (p["threads"].get<int>() == 512 || (p["threads"].get<int>() == 256 && p["attn_heads"].get<int>() == 32))) {
      *why = "attn_depth 1 with attn_rows 32 overflows shared memory at threads 512, and at threads 256 with "
             "attn_heads 32";
      return false;
    }
    // attn_chains 2 puts the queries' lo part in a chain of its own; with one part there is none.
    if (p["attn"].get<std::string>() == "mma" && p["attn_parts"].get<int>() == 1 && p["attn_chains"].get<int>() == 2) {
      *why = "attn_chains 2 needs attn_parts 2 (a chain for the queries' lo part)";
      return false;
    }
    // The bulk feed streams the staged path's stages into mma fragments.
    if (p["feed"].get<std::string>() != "cp_async" &&
        (p["stages"].get<int>() == 0 || p["dequant"].get<std::string>() != "mma")) {
      *why = "feed bulk, next, stream and loader need stages > 0 and dequant mma";
      return false;
    }
    // A consumer warp waits for its stage on the slot's mbarrier by parity,
    // which tells the stage apart from the slot's fill before it only when
    // that fill was the warp's own stage (so it had landed): the ring's
    // depth a multiple of the warp groups that take the stages in turn.
    // The consumer warps must also form whole groups: 4 warps cannot share a
    // stage 8 ways (no group at all), nor 12 warps 8 ways (megakernel.cu's
    // static_assert on FEED_WPG).
    if (p["feed"].get<std::string>() != "cp_async") {
      const int warps = p["threads"].get<int>() / 32, per_stage = 8 / p["feed_chunks"].get<int>();
      if (warps % per_stage != 0) {
        *why = "with feed bulk, next, stream or loader, the consumer warps (threads / 32) must form whole groups "
               "of 8 / feed_chunks warps";
        return false;
      }
      const int light = p["light_warps"].get<int>();
      const int groups = (warps + light) / per_stage;
      if (p["stages"].get<int>() % groups != 0) {
        *why = "with feed bulk, next, stream or loader, stages must be a multiple of the warp groups that eat "
               "the stages ((threads / 32 + light_warps) / (8 / feed_chunks))";
        return false;
      }
    }
    // The light warpgroup's registers come from a 512-thread block's 128 a
    // thread (megakernel.cu, kLightRegs), and its 4 warps form whole groups.
    if (p["light_warps"].get<int>() > 0 &&
        (p["feed"].get<std::string>() != "loader" || p["threads"].get<int>() != 256 ||
         p["blocks_per_sm"].get<int>() != 1 || p["feed_chunks"].get<int>() < 2)) {
      *why = "light_warps 4 needs feed loader, threads 256, blocks_per_sm 1 and feed_chunks 2 or more";
      return false;
    }
    // The loader warpgroup gives registers back from the launch's share a
    // thread (megakernel.cu, kLaunchAlloc: an SM's 64K over the busiest
    // scheduler's warps, rounded down to 8), so it must keep fewer than that.
    if (p["feed"].get<std::string>() == "loader") {
      const int block_threads = p["threads"].get<int>() + 128 + 128 * (p["light_warps"].get<int>() > 0);
      const int sched_warps = (block_threads / 32 + 3) / 4 * p["blocks_per_sm"].get<int>();
      const int launch_alloc = std::min(255, 16384 / (sched_warps * 32)) / 8 * 8;
      if (p["loader_regs"].get<int>() >= launch_alloc) {
        *why = "loader_regs must be below the launch's registers a thread (" + std::to_string(launch_alloc) +
               " here: fewer threads a block or blocks an SM give more)";
        return false;
      }
    }
    // The loader warp walks the blocks' items as the static schedule deals
    // them, and its warpgroup never joins cooperative groups' grid sync
    // (which takes every thread of the block).
    if (p["feed"].get<std::string>() == "loader" &&
        (p["sched"].get<std::string>() != "static" || p["barrier"].get<std::string>() == "coop")) {
      *why = "feed loader needs sched static and a barrier other than coop";
      return false;
    }
    // flow tagged keeps one grid barrier a layer and relies on what these
    // settings leave between phases (megakernel.cu, flow_tag).
    if (p["flow"].get<std::string>() != "barrier" &&
        (p["feed"].get<std::string>() != "loader" || p["reduce"].get<std::string>() != "last" ||
         p["moe_reduce"].get<std::string>() != "atomic" || predicted(p) ||
         p["kda_start"].get<std::string>() != "barrier")) {
      *why = "flow tagged and tagged_o need feed loader, reduce last, moe_reduce atomic, predict off and kda_start barrier";
      return false;
    }
    // down_start tiles counts the gate/up sums' atomics per tile, in the
    // routing's own slots, and keeps the barriers flow tagged relies on
    // (megakernel.cu, DownPhase::wait_for_sums).
    if (p["down_start"].get<std::string>() == "tiles" &&
        (p["moe_reduce"].get<std::string>() != "atomic" || predicted(p) || p["flow"].get<std::string>() != "barrier")) {
      *why = "down_start tiles needs moe_reduce atomic, predict off (with feed loader) and flow barrier";
      return false;
    }
    // The lean loop is one shape: two batches in flight, scales one group ahead.
    if (p["gemv_code"].get<std::string>() == "lean" &&
        (p["pipeline"].get<int>() != 1 || p["scales"].get<std::string>() != "ahead")) {
      *why = "gemv_code lean needs pipeline 1 and scales ahead";
      return false;
    }
    return true;
  };
  return s;
}

KnobSpace host_mega_space() {
  KnobSpace s;
  s.knobs = {
      {"threads", "KT_THREADS", {1, 2, 4, 8}, 2, "worker threads in the step's one parallel region"},
      {"tile", "KT_TILE", {16, 32, 64, 128, 256}, 64, "output columns per work unit of a W4A16 GEMV"},
      {"barrier", "KT_BARRIER", {"spin", "blocking"}, "spin",
       "barrier between phases: an atomic spin barrier or a blocking (futex) one"},
      {"dequant", "KT_DEQUANT", {"lut", "direct"}, "lut",
       "int4 dequant: a 16-entry table per (group, column), or arithmetic per weight"},
      {"mla", "KT_MLA", {"exact", "absorbed"}, "exact",
       "MLA as written (expand every cached row through kv_b) or the absorbed form"},
      {"unroll", "KT_UNROLL", {1, 2, 4}, 2, "row pairs per inner-loop step of a GEMV"},
  };
  return s;
}

std::vector<Template> make_templates() {
  std::vector<Template> t;
  t.push_back({"kimi-mega-cuda", "cuda", "kernels/kimi/cuda/megakernel.cu", cuda_mega_space(), 1,
               "the whole decode step in one cooperative launch (megakernel v1)"});
  t.push_back({"kimi-base-cuda", "cuda", "kernels/kimi/cuda/baseline.cu", KnobSpace{}, 0,
               "one kernel per operation, each weight dequantized to bf16 before its GEMV (PyTorch eager style)"});
  t.push_back({"kimi-mega-host", "host", "kernels/kimi/host/megakernel.cc", host_mega_space(), 1,
               "the whole decode step in one parallel region, barriers between phases"});
  t.push_back({"kimi-base-host", "host", "kernels/kimi/host/baseline.cc", KnobSpace{}, 0,
               "one parallel region per operation"});
  return t;
}

}  // namespace

const std::vector<Template>& templates() {
  static const std::vector<Template> t = make_templates();
  return t;
}

const Template* find_template(const std::string& name) {
  for (const Template& t : templates())
    if (t.name == name) return &t;
  return nullptr;
}

const Template* baseline_template(const std::string& backend) {
  return find_template(backend == "host" ? "kimi-base-host" : "kimi-base-cuda");
}

const Template* megakernel_template(const std::string& backend) {
  return find_template(backend == "host" ? "kimi-mega-host" : "kimi-mega-cuda");
}

std::vector<int> config_signature(const KimiConfig& c) {
  int pattern = 0;
  for (int i = 0; i < c.layers(); ++i)
    if (!c.is_kda(i)) pattern |= 1 << i;
  return {c.hidden,    c.kda_heads, c.kda_head_dim, c.mla_heads, c.kv_lora,  c.qk_nope,  c.qk_rope, c.v_head,
          c.n_experts, c.n_active,  c.n_shared,     c.moe_inter, c.group,    c.layers(), pattern};
}

std::map<std::string, std::string> config_defines(const KimiConfig& c) {
  auto num = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    std::string s = buf;
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
  };
  std::vector<int> sig = config_signature(c);
  const char* names[] = {"KT_D", "KT_KH", "KT_KD", "KT_MH", "KT_R", "KT_NOPE", "KT_ROPE", "KT_VH",
                         "KT_E", "KT_TOPK", "KT_NSH", "KT_I", "KT_G", "KT_LAYERS", "KT_PATTERN_M"};
  std::map<std::string, std::string> d;
  for (size_t i = 0; i < sig.size(); ++i) d[names[i]] = std::to_string(sig[i]);
  d["KT_ROPE_THETA"] = num(c.rope_theta);
  d["KT_SCALING"] = num(c.routed_scaling);
  d["KT_EPS"] = num(c.rms_eps);
  return d;
}

}  // namespace ktune::kimi

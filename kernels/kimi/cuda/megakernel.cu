// Kimi-Linear decode megakernel, v1: one cooperative launch per token runs
// the whole step. The grid is persistent; phases are separated by grid-wide
// barriers; inside a phase every block takes work items round-robin.
//
// Phases per layer (a barrier after each):
//   K layer: [qkvg]  q,k,v,g projections (+ conv/SiLU in the epilogue) and beta
//            [kda]   the gated delta-rule update of S, per (head, 32 value columns)
//            [oproj] o_proj + residual
//   M layer: [mla1]  q and kv_a projections (+ RoPE, cache append in the epilogue)
//            [qabs]  q_abs = W_UK q_nope (absorbed keys)
//            [attn]  attention over the latent cache, split over rows (partials)
//            [wuv]   combine partials, o = W_UV o_lat
//            [oproj] o_proj + residual
//   MoE:     [route] router logits and the shared expert's gate/up
//            [gate]  top-k (every block, identically; with the loader warp, by it),
//                    routed experts' gate/up (KT_PREDICT: the predicted experts')
//            [fix]   KT_PREDICT, only when the routing was not within the
//                    prediction: the routed experts' gate/up again
//            [down]  all experts' down projections summed + residual
//
// W4A16 GEMV work item: 128 output columns x a range of k. A warp handles a
// sub-range of k; lane (g, t) loads 16 bytes (16 columns, 2 rows) at k-pairs
// t and t+4 of each 16-row chunk; nibbles are dequantized exactly (bf16
// sub then mul) and fed to m16n8k16 tensor-core mma (KT_DEQUANT 1) or to
// fp32 FMAs (KT_DEQUANT 0). The mma's B columns carry x split as hi + lo
// bf16 parts, so fp32 inputs (expert activations) keep fp32 accuracy.
// Items split over k publish partial sums; the last to finish a tile (an
// atomic counter) sums them in a fixed order and runs the epilogue.
//
// Knobs (#defines prepended by the renderer): KT_THREADS, KT_BLOCKS_PER_SM,
// KT_BARRIER (0 atomic, 1 cooperative groups, 2 counter), KT_DEQUANT (0 fma, 1 mma),
// KT_UNROLL (chunks of loads in flight per warp), KT_LOAD_HINT (0 plain,
// 1 evict-first streaming), KT_PREFETCH (1: prefetch the next phase's
// weights into L2 before waiting at a barrier), KT_ATTN_HEADS (heads per
// attention item), KT_WAVES (work items per block per phase, target),
// KT_STAGES (0: weights loaded into registers as above; n > 0: streamed
// through an n-deep cp.async pipeline in shared memory, one quantization
// group per stage), KT_EARLY (1, with stages: the first stages of a block's
// next GEMV item are issued before it waits at the barrier), KT_PIPELINE
// (1, register path: a warp issues its next batch of weight loads before
// computing the current one), KT_SCALES (0: each warp fetches a group's
// scales and zeros when it enters the group, and waits for them; 1: an
// item's are copied into shared memory while its first weights load; 2: a
// warp fetches the next group's when it enters a group, so only its first
// group waits), KT_ATTN (1: attention on
// tensor cores, attention_mma.cuh), KT_PROFILE (1: block 0 stamps the start
// of every phase into args.trace, for `ktune bench`'s per-phase table),
// KT_ATTN_ROWS (cached rows per tile of the mma attention, 16 or 32),
// KT_ATTN_DEPTH (tiles in the mma attention's ring beyond the fitted depth),
// KT_NUMBERING (0: each block numbers a GEMV phase's items at the barrier
// before it; 1: once per kind of phase when the launch starts, make_plans;
// 2: once per kind by the prepare table, copied at launch: load_plans;
// 3: the same, and the prepare table lists every item too, each block
// copying its own: no item arithmetic in the step, ItemMap::item),
// KT_SCHED (GEMV items after a block's first: 0 round-robin, 1 from a
// per-phase atomic counter), KT_LEAD (1: a GEMV phase's lead tiles, e.g.
// the shared experts' gate/up while the routed ones wait for the router,
// cut to fill the first wave; ItemMap), KT_GEMV_CODE (1: one out-of-line
// copy of the register path's loop for every phase; gemv_segment_shared;
// 2: the same with fewer instructions per chunk, gemv_segment_lean),
// KT_SPLIT_COST (how split_for prices a phase's small extra items), KT_FEED_Q
// (with a bulk feed: the chunks of a stage each consumer warp computes),
// KT_INFLIGHT (with the loader: at most that many of a block's stage copies
// in flight, 0: as many as the ring has free slots), KT_HOLD (with the
// loader: at most that many of a GEMV phase's stages issued before the
// block's consumers start the phase, 0: no limit), KT_HOLD_RELEASE (with
// KT_HOLD: the rest released when the consumers begin the phase's items, 0,
// or when they pass the grid barrier before it, 1), KT_HOLD_SCOPE (with
// KT_HOLD n: at most n stages of each GEMV phase the consumers have not
// begun, 0, or of all such phases together, 1), KT_REPACK_ORDER (a bulk
// feed's repacked matrix: [tiles][groups] of stages, 0, or [groups][tiles],
// 1, repack_at), KT_HELPERS (1: a
// phase's boundary helpers as one out-of-line copy each, KT_HELPER),
// KT_ATTN_CHAINS (mma attention: the queries' hi and lo parts score into one
// accumulator chain, 1, or two, 2), KT_ATTN_EARLY (mma attention, 1: the
// block's first tiles issued in the q_abs phase, attn_issue_first),
// KT_ATTN_FEED (mma attention: 0, the block's threads issue its row tiles
// by cp.async; 1, the loader warpgroup's spare warps issue them, from q_abs
// on, attention_spare_main, where there is a loader warpgroup, attn_early
// is 0 and predict off),
// KT_ATTN_FIRST (mma attention, 1: an item's first row tile issued alone,
// the rest of its ring once that one has landed; with KT_ATTN_EARLY, only
// the first tile goes out in the q_abs phase),
// KT_ATTN_ROLLED (mma attention, 1: a tile's 16-row steps as loops),
// KT_ATTN_PARTS (mma attention: the queries and probabilities as bf16 hi +
// lo parts, 2, or as one bf16 part, 1),
// KT_FLOW (0: a grid barrier before every phase; 1: none before o_proj,
// the MoE gate/up and a layer's first phase: their inputs, the attention
// output o, h and the next layer's x, are written as words that carry
// their own validity and the phase's staging polls them, flow_tag; 2: only
// o_proj's),
// KT_CACHE_HINT (1: the attention's cache rows are marked first to evict
// from L2; 2: last to evict, so that they stay there for the next step),
// KT_HANDOFF (a k-split's partial sums, and with KT_LOGITS 0 the router's
// logits, published by a fence and an atomic, or by one release /
// acquire-release atomic), KT_GATHER (0: a k-split tile's items count
// themselves in by an atomic and the last sums the partials; 1: split 0
// polls the others' partials as they land: gather_polled), KT_LOGITS (0:
// the router's logits counted by router_done, acquired, then read; 1:
// written as words that carry their own validity and polled:
// load_logits), KT_PREDICT (1 top8, 2 top9, with the loader warp: the
// loader warpgroup's other warps predict the router's logits during
// o_proj, predictor_main; the loader streams the predicted top TOPK (or
// TOPK + 1) experts' gate/up from the phase's start, loader_predict; the
// routing picks its TOPK among them, match_prediction, or a fix phase
// computes them, MoeFixPhase), KT_KDA_START (0: the KDA phase starts after a grid
// barrier; 1: a KDA item starts once its head's q, k, v, g tiles and beta are published,
// per-head counters instead of the barrier), KT_DOWN_START (0: the MoE down
// phase starts after a grid barrier; 1: a down item starts once the gate/up
// tiles its k range reads are complete, per-tile counters instead of the
// barrier: gu_ready), KT_REDUCE (0: the last of a
// tile's k-split items sums the partials and runs the epilogue; 1: o_proj's
// and down's items add their partial sums into an fp32 vector with
// fire-and-forget atomics, and the next phase's input staging adds the
// residual, so no item waits on a counter or on the other items' partials;
// the sums' order, so their last bits, then vary from run to run:
// stage_carried), KT_MOE_REDUCE (1: the MoE gate/up items, the shared
// experts' k-split lead tiles among them, add their sums into the layer's
// fp32 gate/up buffer with atomics, so no lead item waits on a counter
// before its block reaches its routed tile; the down phase's staging reads
// them; 0: the last item of a tile sums the partials), KT_LAUNCH_PREFETCH
// (1, with the loader warp: the next launch's first stages of this block
// prefetched into L2 once this launch's are issued), KT_FEED (with KT_STAGES: 0, every thread cp.asyncs
// 16-byte pieces of the weights as stored; 1, thread 0 bulk-copies whole
// stages, one 8.5-KB copy each, from a copy of the weights that the prepare
// kernel ktune_k1 repacks once per load into stages (nibbles in mma fragment
// order, scales and 128 + zeros after them), completion and release on
// mbarriers, warps in groups of 4 taking the stages in turn; 2, the same,
// the block's next item's stages streamed behind the current one's; 3, also
// the next GEMV phase's first item's behind a phase's last: gemv_staged,
// repack_stage; 4, a fourth warpgroup whose first warp, the loader, streams
// every stage of the block's GEMV items of the whole step, across the grid
// barriers, which it never joins: loader_main, consume_stages).
#include "kernels/kimi/cuda/abi.h"
// KT_LIGHT_WARPS 4 (with KT_FEED 4): a light warpgroup whose warps only
// eat GEMV stages beside the consumers (light_main).
#ifndef KT_LIGHT_WARPS
#define KT_LIGHT_WARPS 0
#endif
// Threads per block: KT_THREADS, the loader warpgroup with KT_FEED 4, and
// the light warpgroup with KT_LIGHT_WARPS.
#define KT_BLOCK_THREADS (KT_THREADS + (KT_FEED == 4 ? 128 : 0) + (KT_LIGHT_WARPS ? 128 : 0))
#if KT_FEED == 4
// The loader warpgroup (threads KT_THREADS .. KT_THREADS + 127: the loader
// warp and three that only lend their registers) never joins the block's
// barriers: they are named barrier 1 among the other threads.
#define KT_SYNC_THREADS KT_THREADS
#endif
#include "kernels/kimi/cuda/common.cuh"
#include "kernels/kimi/topk.h"

// predict top8 / top9 needs the loader warp (it ranks the prediction and
// streams the predicted experts) and the prepare kernel (it makes the tables).
#define KT_PREDICTED (KT_PREDICT >= 1 && KT_FEED == 4)
// KT_HOLD counts the loader's GEMV phases as the consumers' one for one:
// with the loader and no prediction (whose fix phase runs on some layers).
#define KT_HOLD_ON (KT_HOLD > 0 && KT_FEED == 4 && !KT_PREDICTED)
// KT_HELPERS 1: helpers that run once a phase at its start or end, each
// inlined at several call sites (a phase's input RMSNorm, the beta and
// router rows' dots, the k-split gather), as one out-of-line copy each:
// every inlined copy ran cold from L2 each step (RESULTS, run 255). Their
// arguments go by value (a Ctx passed to a call would move to local memory).
// It cost 2.6-3.2 us a step (run 258), as split_for out of line did (run
// 172): the calls cost more than the ~14 KB of code they take out.
#if KT_HELPERS
#define KT_HELPER __device__ __noinline__
#else
#define KT_HELPER KT_DEV
#endif
// The prepare table (ktune_k1): the bulk feeds' repacked weights, and
// KT_NUMBERING 2's plans (and 3's items).
#define KT_HAS_PREPARE (KT_FEED >= 1 || KT_NUMBERING >= 2)
// Tests only: KT_TEST_PLANS_GRID n, the prepare table records a grid n
// blocks larger than the one it numbered, as a launcher that sized the step
// and prepare launches apart would leave it (load_plans must trap); and
// KT_TEST_ITEMS_MAX n, a kind of phase may list at most n items in the
// prepare table (prepare_plans must trap when one has more).
#ifndef KT_TEST_PLANS_GRID
#define KT_TEST_PLANS_GRID 0
#endif
#ifndef KT_TEST_ITEMS_MAX
#define KT_TEST_ITEMS_MAX 0
#endif
// Tests only: KT_PREDICT_MISS 1, the prediction drops its best expert, so
// the routing is never within it; KT_PREDICT_FIX 0, a missed prediction is
// not repaired (the output is then wrong), so a test that passes shows
// every layer's routing was within the prediction.
#ifndef KT_PREDICT_MISS
#define KT_PREDICT_MISS 0
#endif
#ifndef KT_PREDICT_FIX
#define KT_PREDICT_FIX 1
#endif
// Tests only: KT_FLOW_LATE 1, with KT_FLOW 1 or 2 every tagged word's
// writer first yields a while (in the emulator, to the fibers that poll
// it), so the polls come before the words.
#ifndef KT_FLOW_LATE
#define KT_FLOW_LATE 0
#endif
// Tests only: KT_DOWN_LATE 1, with KT_DOWN_START 1 every gate/up item
// first yields a while (in the emulator, to the down items that wait for
// it) before it adds its sums, so the down items reach their waits first.
#ifndef KT_DOWN_LATE
#define KT_DOWN_LATE 0
#endif
// Tests only: KT_ATTN_LATE 1, with KT_ATTN_FEED 1 the spare warps yield a
// while before issuing each attention tile, so that the consumers reach the
// tile first and must wait for it.
#ifndef KT_ATTN_LATE
#define KT_ATTN_LATE 0
#endif

namespace mk {

constexpr int D = KT_D, KH = KT_KH, KD = KT_KD, C = KH * KD;
constexpr int MH = KT_MH, R = KT_R, NOPE = KT_NOPE, ROPE = KT_ROPE, VH = KT_VH, QH = NOPE + ROPE;
constexpr int QDIM = MH * QH, KVA = R + ROPE, KVB = MH * (NOPE + VH), MO = MH * VH;
constexpr int E = KT_E, TOPK = KT_TOPK, NSH = KT_NSH, I = KT_I, G = KT_G;
constexpr int SLOTS = TOPK + NSH;  // experts evaluated per token and layer
// The MoE gate/up phase's routed slots: the routing's TOPK experts, or with
// KT_PREDICT the predicted TOPK (top8) or TOPK + 1 (top9); and the gate/up
// sums' slots: those, the shared experts', and with KT_PREDICT TOPK more
// for a missed prediction (the fix phase, MoeFixPhase).
constexpr int RSLOTS = TOPK + (KT_PREDICTED && KT_PREDICT == 2 ? 1 : 0);
constexpr int GU_SLOTS = RSLOTS + NSH + (KT_PREDICTED ? TOPK : 0);
constexpr int THREADS = KT_THREADS, WARPS = THREADS / 32;
constexpr int TILE = 128, CHUNK = 16;
constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr int cmin(int a, int b) { return a < b ? a : b; }
[[maybe_unused]] constexpr int PRED_K = cmax(C, MO);  // KT_PREDICT: where a prediction table's x part starts (predict_tables)
[[maybe_unused]] constexpr int kPredParts = 6;  // KT_PREDICT: warps' parts summed into each prediction (predictor_main)
constexpr int KMAX = cmax(cmax(D, C), cmax(cmax(MO, SLOTS * I), R));
constexpr int HG = KT_ATTN_HEADS < MH ? KT_ATTN_HEADS : MH;  // heads per attention item
constexpr int kMaxTiles = 1024, kMaxItems = 4096, kMaxChunks = 512;
// A GEMV phase's k-split partials' slots (KT_FLOW 1 or 2: half of them, flow_half).
constexpr int kItemSlots = KT_FLOW ? kMaxItems / 2 : kMaxItems;
constexpr int kMaxGemvPhases = 8 * KT_LAYERS;  // run_gemv_phase calls per launch, at most
constexpr float kQkScale = 0.07216878364870322f;  // 192^-0.5, for QH = 192 (checked below)

static_assert(THREADS % 32 == 0 && THREADS >= 128 && THREADS <= 1024, "threads");
static_assert(KD == 128 && NOPE == 128 && VH == 128 && ROPE == 64, "head dims fixed by the kernel's lane maps");
static_assert(G == 128, "group size 128");
static_assert(THREADS >= TILE && THREADS >= KD, "kda item split");
static_assert(R % 64 == 0 && MH % HG == 0, "latent dims");
static_assert(E <= 64 * 4, "experts");
static_assert(KT_SCHED == 0 || KT_SCHED == 1, "sched");
static_assert(KT_LEAD == 0 || KT_LEAD == 1, "lead");
static_assert(KT_ATTN_ROWS == 16 || KT_ATTN_ROWS == 32, "attn_rows");
static_assert(KT_ATTN_DEPTH >= 0 && KT_ATTN_DEPTH <= 2, "attn_depth");
static_assert(KT_NUMBERING >= 0 && KT_NUMBERING <= 3, "numbering");
static_assert(KT_KDA_START == 0 || KT_KDA_START == 1, "kda_start");
static_assert(KT_DOWN_START == 0 || KT_DOWN_START == 1, "down_start");
// down_start tiles counts the gate/up sums' atomics per tile (moe_reduce
// atomic), in the routing's own slots (no prediction), and keeps the
// barriers flow tagged relies on.
static_assert(KT_DOWN_START == 0 || (KT_MOE_REDUCE == 1 && !KT_PREDICTED && KT_FLOW == 0),
              "down_start tiles: moe_reduce atomic, predict off, flow barrier");
static_assert(KT_REDUCE == 0 || KT_REDUCE == 1, "reduce");
static_assert(KT_MOE_REDUCE == 0 || KT_MOE_REDUCE == 1, "moe_reduce");
static_assert(KT_LAUNCH_PREFETCH == 0 || KT_LAUNCH_PREFETCH == 1, "launch_prefetch");
static_assert(KT_LOGITS == 0 || KT_LOGITS == 1, "logits");
static_assert(KT_GATHER == 0 || KT_GATHER == 1, "gather");
static_assert(KT_PREDICT >= 0 && KT_PREDICT <= 2, "predict");
static_assert(KT_PREDICT_STREAM == 0 || KT_PREDICT_STREAM == 1, "predict_stream");
static_assert(KT_FLOW >= 0 && KT_FLOW <= 2, "flow");
// KT_FLOW 1: h and x tagged too (KT_FLOW 2: the attention output o only).
#define KT_FLOW_HX (KT_FLOW == 1)
static_assert(KT_ATTN_EARLY == 0 || KT_ATTN_EARLY == 1, "attn_early");
// KT_ATTN_FEED and KT_ATTN_PARTS act on the mma attention only (the fma one ignores them).
// KT_ATTN_FEED 1 needs the loader warpgroup's spare warps (the predictor's
// under predict) and every tile theirs to issue (attn_early issues the first
// ones in q_abs); elsewhere the block's threads issue the tiles, as with 0.
#define KT_ATTN_SPARE (KT_ATTN == 1 && KT_ATTN_FEED == 1 && KT_FEED == 4 && KT_ATTN_EARLY == 0 && !KT_PREDICTED)
static_assert(KT_ATTN_FEED == 0 || KT_ATTN_FEED == 1, "attn_feed");
static_assert(KT_ATTN_ROLLED == 0 || KT_ATTN_ROLLED == 1, "attn_rolled");
static_assert(KT_ATTN_FIRST == 0 || KT_ATTN_FIRST == 1, "attn_first");
static_assert(KT_HOLD >= 0, "hold");
static_assert(KT_HOLD_RELEASE == 0 || KT_HOLD_RELEASE == 1, "hold_release");
static_assert(KT_HOLD_SCOPE == 0 || KT_HOLD_SCOPE == 1, "hold_scope");
static_assert(KT_REPACK_ORDER == 0 || KT_REPACK_ORDER == 1, "repack_order");
static_assert(KT_HELPERS == 0 || KT_HELPERS == 1, "helpers");
static_assert(KT_ATTN_PARTS == 1 || KT_ATTN_PARTS == 2, "attn_parts");
static_assert(KT_ATTN != 1 || KT_ATTN_PARTS == 2 || KT_ATTN_CHAINS == 1, "attn_chains 2 splits the hi and lo parts' chains");
static_assert(!KT_FLOW || cmax(cmax(4 * C, QDIM + KVA + TILE), cmax(GU_SLOTS * 2 * I, D)) / TILE <= kMaxTiles / 2,
              "flow tagged: a GEMV phase's tiles fit half the counters");
// flow tagged keeps one grid barrier a layer (before the KDA phase, before
// q_abs), which orders what the removed ones ordered besides the tagged
// inputs: see flow_tag.
static_assert(KT_FLOW == 0 || (KT_FEED == 4 && KT_REDUCE == 0 && KT_MOE_REDUCE == 1 && KT_PREDICT == 0 &&
                               KT_KDA_START == 0),
              "flow tagged: feed loader, reduce last, moe_reduce atomic, predict off, kda_start barrier");
// gather poll needs the prepare kernel (KT_FEED >= 1) to mark the partials.
#define KT_GATHER_POLL (KT_GATHER == 1 && KT_FEED >= 1)
static_assert(KT_FEED == 0 || (KT_FEED <= 4 && KT_STAGES > 0 && KT_DEQUANT == 1),
              "feed bulk, next, stream or loader: stages > 0, dequant mma");
static_assert(KT_FEED != 4 || (KT_SCHED == 0 && KT_BARRIER != 1),
              "feed loader: static schedule, no cooperative-groups barrier");

// A GEMV phase's item numbering as plain numbers (number_items works it out,
// ItemMap numbers the items with it). KT_NUMBERING 0: barrier_before works
// out the next phase's while the grid barrier completes; 1: it depends only
// on the phase's shape and the grid, so each block works out one per kind
// of GEMV phase when the launch starts (make_plans); 2: the prepare table
// works them out once (prepare_plans) and each launch copies them into
// shared memory (load_plans); 3: the prepare table also lists the items
// themselves (Scratch::item_table), and each launch copies its block's first
// kBlockItems of each kind of phase.
struct ItemPlan {
  int rows = 0, lead = 0, S_lead = 1, S = 1, nch = 0, items = 0;
};
// KT_NUMBERING 3: a block's items of one kind of phase held in shared
// memory (the H200's grid has at most 2 a block; a smaller grid reads the
// rest from the table).
constexpr int kBlockItems = 4;
enum PlanKind {
  kPlanQkvg, kPlanMla1, kPlanOprojK, kPlanOprojM, kPlanWuv, kPlanMoeA, kPlanDown,
#if KT_PREDICTED
  kPlanMoeFix,
#endif
  kPlanKinds
};

// The prepare table's one launch (ktune_k1): its block size and blocks an SM.
constexpr int kPrepareThreads = 256, kPrepareBlocksPerSm = 4;

// ---- global scratch (variant-owned, zeroed once by the runner) ---------------
struct alignas(16) Scratch {
  KtGridBarrier bar;
  unsigned pad[14];
  int counters[kMaxTiles];
  unsigned router_done[KT_LAYERS];  // KT_LOGITS 0: router logits written, per layer (reset when the launch ends)
  unsigned head_ready[KT_LAYERS][KH];  // KT_KDA_START 1: a head's q, k, v, g tiles and beta published (likewise)
#if KT_DOWN_START == 1
  // Chunks of K added into each gate/up tile of a layer's gu, [slot][gate,
  // up][tile] (likewise): D / CHUNK once the tile is complete.
  unsigned gu_ready[KT_LAYERS][GU_SLOTS * 2 * (I / TILE)];
#endif
  unsigned next_item[kMaxGemvPhases];  // KT_SCHED 1: items taken beyond the first wave, per GEMV phase (reset likewise)
  alignas(16) uint16_t xbuf[2][D];  // the residual stream between layers
  alignas(16) uint16_t hbuf[D];     // after attention, before the MoE
  alignas(16) uint16_t act[3][C];   // KDA q, k, v after conv + SiLU
  alignas(16) uint16_t graw[C];
  alignas(16) uint16_t beta_raw[KH > 8 ? KH : 8];
  alignas(16) uint16_t kda_o[C];
  alignas(16) uint16_t mla_q[QDIM];
  alignas(16) float q_abs[MH * R];
  alignas(16) uint16_t mla_o[MO];
  alignas(16) float attn_m[kMaxChunks * MH];
  alignas(16) float attn_l[kMaxChunks * MH];
  alignas(16) uint16_t logits[E > 8 ? E : 8];  // KT_LOGITS 0, after router_done
  // KT_LOGITS 1: each layer's logits as words that carry their own
  // validity (bf16 bits << 16 | 1), 0 until written (reset when the launch ends).
  unsigned logit_words[KT_LAYERS][E > 8 ? E : 8];
  // The MoE's gate and up sums, one buffer per layer parity: with
  // KT_MOE_REDUCE 1 the items add into the layer's, which the next layer
  // (or the next launch) zeroes when it starts.
  alignas(16) float gu[2][GU_SLOTS * 2 * I];
  alignas(16) float partials[kMaxItems * TILE];
  alignas(16) float carry[KT_LAYERS][2][D];  // KT_REDUCE 1: o_proj's and down's sums per layer (zeroed at launch start)
  alignas(16) float attn_acc[kMaxChunks * MH * R];
#if KT_NUMBERING >= 2
  // Each kind of GEMV phase's numbering, for a grid of plans_grid blocks
  // (the prepare table's: prepare_plans).
  ItemPlan plans[kPlanKinds];
  int plans_grid;
#endif
#if KT_NUMBERING == 3
  uint4 item_table[kPlanKinds][kMaxItems];  // each kind's items, packed (pack_item); row items' entries unused
#endif
#if KT_FLOW
  // The phases' inputs as tagged words (flow_tag): the attention output o
  // (KDA's or w_uv's), h (o_proj's) and x (down's, the next layer's input).
  alignas(16) unsigned flow_o[cmax(C, MO)];
  alignas(16) unsigned flow_h[D];
  alignas(16) unsigned flow_x[D];
  unsigned epoch;  // launches ended (the last block out counts them)
#endif
#if KT_PREDICTED
  // KT_PREDICT: each layer's prediction of its router logits in parts, as
  // words that carry their validity (predictor_main; 0 until written, reset
  // when the launch ends), and the tables they are computed from (the
  // prepare kernel's: predict_tables).
  unsigned pred_words[KT_LAYERS][E][kPredParts];
  alignas(16) uint16_t pred_table[KT_LAYERS][E][PRED_K + D];
#endif
};

// ---- the shared-memory pipeline ----------------------------------------------------
// A GEMV stage: one quantization group (8 chunks = 64 packed row pairs) of a
// 128-column tile, its 16-byte column groups swizzled by row so a warp's
// fragment loads hit distinct banks, plus the group's scales and zeros.
constexpr int STAGES = KT_STAGES > 0 ? KT_STAGES : 1;
constexpr int STAGE_CHUNKS = G / CHUNK;
// An item spans at most KMAX / G + 1 groups (KT_SCALES 1 stages them all).
constexpr int kScaleGroups = KT_SCALES == 1 && KT_STAGES == 0 ? KMAX / G + 1 : 1;
struct alignas(16) Stage {
  uint8_t w[STAGE_CHUNKS * 8 * TILE];
  uint16_t sc[TILE], ze[TILE];
};
// An attention tile: ATT_ROWS cached rows (latent and rope parts).
// kRopeHint: the L2 hint of its rope keys' copies. Plain here: with
// KT_CACHE_HINT's policy, ptxas 13.0.88 encoded some of them (an LDGSTS
// whose shared address has a uniform-register part) with a policy from
// uniform registers no instruction wrote, and the step died with an
// illegal instruction, at threads 256 with the cp.async feed (RESULTS,
// runs 299-302). The rope keys are a ninth of a tile's bytes.
constexpr int ATT_ROWS = 16, ATT_STAGES = 3;
struct alignas(16) AttTile {
  static constexpr int kRopeHint = 0;
  uint16_t c[ATT_ROWS][R];
  uint16_t k[ATT_ROWS][ROPE];
};
// The mma attention's shared memory (KT_ATTN 1; attention_mma.cuh says why):
// rows padded by 16 bytes, partial scores of AM_WD warps, probabilities as
// bf16 hi + lo, rescale factors. AM_HP heads per pass over a chunk: 32 only
// where two m16 tiles' accumulators and queries (2 AM_DW registers) fit.
constexpr int AM_ROWS = KT_ATTN_ROWS;  // cached rows per tile (16 or 32: two m16n8k16 row steps)
constexpr int AM_STAGES = (KT_BLOCKS_PER_SM == 1 ? (AM_ROWS == 16 ? 4 : 3) : 2) + KT_ATTN_DEPTH;
constexpr int kSpareThreads = 64;  // KT_ATTN_FEED 1: the loader warpgroup's warps 1 and 2 issue the tiles
constexpr int AM_WMAX = 16 / KT_BLOCKS_PER_SM;
// Warps that split the latent dims: a power of two, so the dims split evenly
// (12 warps use 8; the others skip those steps).
constexpr int pow2_floor(int x) { return x < 2 ? 1 : 2 * pow2_floor(x / 2); }
constexpr int AM_WD = pow2_floor(cmin(WARPS, cmin(R / 16, AM_WMAX)));
constexpr int AM_DW = R / AM_WD;
// Registers per thread: an SM's four schedulers each have 16K registers and
// take every fourth warp, so the busiest holds ceil(warps / 4) of each block
// (12 warps with the loader warpgroup: 168).
constexpr int kSchedWarps = (KT_BLOCK_THREADS / 32 + 3) / 4 * KT_BLOCKS_PER_SM;
constexpr int kLaunchRegs = 16384 / (kSchedWarps * 32) < 255 ? 16384 / (kSchedWarps * 32) : 255;
// KT_FEED 4: the loader warpgroup's registers a thread, and what that leaves
// the consumers. setmaxnreg takes multiples of 8 (at most 256), and an inc
// waits until the block's own released registers cover it: the consumers
// may take only what the loader warpgroup gives back from the launch's
// allocation (ptxas's count: kLaunchRegs rounded down to 8). Asking for more
// waits forever (run 118: 48 and 232 hung; the SM's spare registers do not count).
// 64 since the loader ranks the router's logits (loader_route): at 40 that
// code spilled and took ~3 us a layer (run 146). 72 since it also plans the
// down phase early (load_moe): ptxas's spills fell, and the consumers keep 216.
// Knob loader_regs: 72 or 88 (ptxas, nvcc 13.0: 48 / 132 B of spills at 72,
// 8 / 116 at 88, the consumers at 208; 88 was 1-3 us a step faster on the
// H100, RESULTS runs 328-330: the spare warps' attention loop no longer
// spills, the consumers' hot loop is unchanged); studies set other values
// (scripts/ptxas_check.sh KT_THREADS=384 KT_LOADER_REGS=40: what 12 consumer
// warps would get).
#ifndef KT_LOADER_REGS
#define KT_LOADER_REGS 88
#endif
constexpr int kLoaderRegs = KT_LOADER_REGS;
// KT_LIGHT_WARPS: the light warpgroup keeps kLightRegs and lends the rest
// to the consumers too. At 512 threads the launch gives 128 a thread; 88
// for the loader warpgroup (loader_regs) and 88 for the light one leave the
// consumers 168 (176 at loader_regs 72). ptxas's spills, the kernel's, at
// loader_regs 72: 116 / 336 B at 88, 180 / 452 at 104 (consumers 168),
// 144 / 336 at 72 (consumers 184: the light loop spills); at loader_regs
// 88: 156 / 436. The 512-thread launch's 128 registers cost ~100 B of the
// loads with or without the light loop (RESULTS, run 328's prediction).
// Studies: KT_LIGHT_REGS n sets it.
#ifndef KT_LIGHT_REGS
#define KT_LIGHT_REGS 88
#endif
constexpr int kLightWarps = KT_LIGHT_WARPS, kLightRegs = KT_LIGHT_REGS;
static_assert(kLightWarps == 0 || (kLightWarps == 4 && KT_FEED == 4), "light warps: a warpgroup, with the loader");
constexpr int kLaunchAlloc = kLaunchRegs / 8 * 8;
constexpr int kLentRegs = 128 * (kLaunchAlloc - kLoaderRegs) + (kLightWarps ? 128 * (kLaunchAlloc - kLightRegs) : 0);
constexpr int kConsumerRegs = cmin(256, kLaunchAlloc + kLentRegs / THREADS / 8 * 8);
static_assert(KT_FEED != 4 || (kConsumerRegs >= kLaunchAlloc && kLaunchAlloc > kLoaderRegs), "loader registers");
constexpr int kRegBudget = KT_FEED == 4 ? cmin(255, kConsumerRegs) : kLaunchRegs;
constexpr int AM_HP = HG > 16 && 2 * AM_DW + 64 < kRegBudget ? 32 : 16;
struct alignas(16) AttMmaTile {
  static constexpr int kRopeHint = KT_CACHE_HINT;  // AttTile says why the other differs
  uint16_t c[AM_ROWS][R + 8];
  uint16_t k[AM_ROWS][ROPE + 8];
};
struct alignas(16) AttMma {
  AttMmaTile tile[AM_STAGES];
  float part[AM_WD][AM_HP][AM_ROWS + 8];
  uint16_t p[2][AM_HP][AM_ROWS + 8];
  float corr[AM_HP];
};
constexpr int kPipeBytes = cmax(cmax(int(sizeof(Stage)) * (KT_STAGES > 0 ? STAGES : 0), int(sizeof(AttTile)) * ATT_STAGES),
                                KT_ATTN == 1 ? int(sizeof(AttMma)) : 0);

// ---- per-block shared memory ------------------------------------------------------
// 128-byte aligned as its `pipe` member is (an alignas(16) here was a
// reduction the compiler ignored, with a warning).
struct alignas(128) Smem {
  uint32_t xs_hi[KMAX / 2];  // the GEMV input as packed bf16 pairs (k even in the low half)
  uint32_t xs_lo[KMAX / 2];  // the rest of an fp32 input (x - hi), zero for bf16 inputs
  float red[WARPS + kLightWarps][TILE];  // each warp's sums of a GEMV item (the light warps' after the consumers')
  float ytile[TILE];
  float bsum[WARPS];
  int flag;
  int next_item;  // KT_SCHED 1: the block's next GEMV item (thread 0 took it)
  int topk[TOPK];
  float topw[TOPK];
  float kq[KD], qq[KD], dec[KD];
  float part[2][WARPS][32];
  float cw[kMaxChunks];
  float wden;  // WuvPhase: the combined softmax's denominator
  alignas(16) float lv[E];
  float order_v[TOPK + 1];  // rank_experts: the largest logits, in rank order
  ktune::kimi::topk_detail::Item items[E];
  uint64_t full[STAGES], empty[STAGES];  // KT_FEED > 0: a stage landed / its warps are done with it (mbarriers)
  size_t next_base[SLOTS > 4 ? SLOTS : 4];  // KT_FEED 2, 3: the next item's segments' first stages (thread 0's)
  size_t next_step[SLOTS > 4 ? SLOTS : 4];  // and their steps from one group's stage to the next's
  // KT_FEED 4: what the loader warp waits for: MoE layers whose experts the
  // block has selected (the routed tiles' weights), M layers whose attention
  // is done with the ring's memory.
  unsigned routed_layers, attentions;
#if KT_LIGHT_WARPS
  // The consumers' current GEMV item for the light warps (light_main): its
  // first stage in the block's count, first group and stages (n < 0: the
  // launch is over); posted on light_go, eaten when light_done completes.
  uint64_t light_go, light_done;
  unsigned light_eaten;
  int light_g0, light_n;
#endif
#if KT_HOLD_ON
  unsigned gemv_started;  // run_gemv_phase calls the consumers have begun (KT_HOLD's signal to the loader)
#if KT_HOLD_SCOPE == 1
  unsigned fed_start[kMaxGemvPhases + 1];  // the loader's: stages fed before its GEMV phase i (1-based) began
#endif
#endif
#if KT_ATTN_SPARE
  // KT_ATTN_FEED 1: q_abs phases whose loads the block has issued (the
  // spare warps may then issue attention tiles), and the tile slots' mbarriers.
  unsigned qabs_layers;
  uint64_t att_full[AM_STAGES], att_empty[AM_STAGES];
#endif
#if KT_PREDICTED
  // Layers whose attention output o is complete (o_proj's barrier passed:
  // predictor_main starts), and whose o_proj items this block has done
  // (loader_predict polls then).
  unsigned o_layers, oproj_layers;
  // KT_PREDICT (the loader's): the predicted experts of the layers of each
  // parity, in rank order; for the routing's slot s (topk), the gate/up
  // slot that holds its sums (match_prediction); miss: the fix phase runs.
  int pred[2][RSLOTS];
  int gslot[TOPK];
  int miss;
#endif
#if KT_NUMBERING >= 1
  ItemPlan plans[kPlanKinds];  // each kind of GEMV phase's numbering (make_plans, load_plans)
#endif
#if KT_NUMBERING == 3
  uint4 block_items[kPlanKinds][kBlockItems];  // the block's first items of each kind (load_plans)
#endif
  unsigned long long route_at[2];  // profile: when the loader saw the logits and selected the experts
  alignas(128) unsigned char pipe[kPipeBytes];  // GEMV stages or attention row tiles (128-byte aligned for bulk copies)
  alignas(16) uint16_t gscale[kScaleGroups][2][TILE];  // KT_SCALES 1: an item's scales and zeros
};
// sm_90 gives a block at most 227 KB of shared memory, and an SM 228 KB of
// which each resident block's system use takes 1 KB: a point past either
// fails here, in the compiler's front end, rather than at its first launch
// (the knobs' constraint refuses the known ones before any build).
static_assert(sizeof(Smem) <= 227 * 1024 && KT_BLOCKS_PER_SM * (sizeof(Smem) + 1024) <= 228 * 1024,
              "shared memory: Smem exceeds what sm_90 gives a block (the ring, attention tiles or heads too large)");

struct Ctx {
  const KimiDeviceArgs& a;
  Scratch* s;
  Smem* sm;
  int tid, lane, warp;
  unsigned target = 0;  // the counter barrier's next goal (thread 0)
  int stamp = 0;        // profile entries written
  int barriers = 0;     // grid barriers passed (profile: each block's arrival times)
  int layer = 0, phase = 0;  // the phase stamped last (profile)
  int items = 0;        // GEMV items this block has finished in that phase
  bool early = false;   // the first stages of this block's next GEMV item are already in flight
  bool routed = false;  // this block has selected the current MoE layer's experts (false again after its down phase)
  int gemv_phases = 0;  // run_gemv_phase calls so far in this launch (KT_SCHED 1's counter index)
  const float* carried = nullptr;  // KT_REDUCE 1: the sums the last GEMV phase left for the next staging
  unsigned fed = 0;    // KT_FEED > 0: stages thread 0 has issued into the ring this launch
  unsigned fed_phases = 0;  // KT_HOLD: the loader's GEMV phases begun (feed_items calls)
  unsigned eaten = 0;  // KT_FEED > 0: stages the block has passed (every thread counts)
  unsigned att_tiles = 0;  // KT_ATTN_FEED 1: attention tiles of this launch so far (the spare warps' issued, the block's eaten)
  int pre = 0;         // KT_FEED > 0: stages of the block's next GEMV item already issued
#if KT_LIGHT_WARPS
  unsigned light_items = 0;  // GEMV items posted to the light warps (light_done's phases)
#endif
  // KT_FEED 2, 3: the block's GEMV item after the current one, when known
  // (name_next): its stages' count, first group, groups per segment (its
  // segments' first stages are in c.sm->next_base: an array here would put
  // the whole context in local memory).
  int next_n = 0, next_g0 = 0, next_seg_groups = 1, next_seg0 = 0;
  unsigned long long row_at = 0;  // profile: when this block published its router rows this layer (thread 0)
  unsigned long long routed_at = 0;  // profile: when warp 0 computed this block's first routed gate/up item this layer
  ItemPlan plan;         // the numbering of GEMV phase plan_phase (a gemv_phases index), if barrier_before made it
  int plan_phase = -1;
#if KT_FLOW
  unsigned epoch = 0;  // Scratch::epoch when the launch started (flow_tag)
  unsigned tag = 0;    // flow_tag of the current layer: what its tagged words carry
#endif
};

// Profile: block 0 stamps (tag, time) at the start of each phase, tag
// layer * 16 + phase, and at points inside it (kPhase* below), tag 1024 +
// (layer * 16 + phase) * 16 + point (see kPhaseNames in agent/bench.cc).
// Points 2-5 and 14-15 are the MoE routing's events (stamp_event), which
// every block records; points 6-8 are block 0's router-row item and its
// first w_uv item's staging. The runner's trace holds 512 stamps.
constexpr int kPhaseItem = 9, kPhaseItemComputed = 10, kPhaseItemDone = 11, kPhaseBarrier = 12,
              kPhasePrefetch = 13;
KT_DEV void stamp(Ctx& c, int layer, int phase, bool event = false) {
#if KT_PROFILE
  const bool point = event || phase >= kPhaseItem;
  if (!point) {
    c.layer = layer;
    c.phase = phase;
    c.items = 0;
  }
  if (blockIdx.x == 0 && c.tid == 0 && c.a.trace && c.stamp < KT_TRACE_STAMPS) {
    unsigned long long* t = reinterpret_cast<unsigned long long*>(c.a.trace);
    t[1 + 2 * c.stamp] = (unsigned long long)(point ? 1024 + (c.layer * 16 + c.phase) * 16 + phase : layer * 16 + phase);
    t[2 + 2 * c.stamp] = kt_globaltimer();
    t[0] = (unsigned long long)(++c.stamp);
  }
#else
  (void)c;
  (void)layer;
  (void)phase;
  (void)event;
#endif
}

KT_DEV int imin(int a, int b) { return a < b ? a : b; }
KT_DEV int imax(int a, int b) { return a > b ? a : b; }
KT_DEV uint32_t word_of(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// Profile: every block's time at one record of the trace's per-block part
// (`at`, or now when 0; a block that passes with nothing to say writes
// nothing), then the next record.
KT_DEV void stamp_all_blocks(Ctx& c, unsigned long long at) {
#if KT_PROFILE
  if (c.tid == 0 && c.a.trace && c.barriers < KT_TRACE_MAX_BARRIERS && blockIdx.x < KT_TRACE_MAX_BLOCKS) {
    unsigned long long* t = reinterpret_cast<unsigned long long*>(c.a.trace);
    if (at != ~0ull) t[KT_TRACE_ARRIVALS + c.barriers * KT_TRACE_MAX_BLOCKS + blockIdx.x] = at ? at : kt_globaltimer();
  }
  ++c.barriers;
#else
  (void)c;
  (void)at;
#endif
}

// Profile: every block's arrival (its last warp done with the phase).
KT_DEV void stamp_arrival(Ctx& c) {
#if KT_PROFILE
  kt_block_sync();
#endif
  stamp_all_blocks(c, 0);
}

// Profile: every block's time at an event of the MoE routing (kEvent*,
// points of the phase like kPhaseBarrier, in the same per-block records as
// the arrivals); `at` as in stamp_all_blocks (~0: this block has none).
// Every block passes each event once a layer, so the records stay aligned.
constexpr int kEventStaged = 2, kEventRowPublished = 3, kEventLogitsSeen = 4, kEventRouted = 5;
constexpr int kEventRoutedReached = 14, kEventRoutedComputed = 15;  // the block's first routed gate/up item
constexpr int kPointRowStart = 6;  // block 0 only: its router rows' item starts
constexpr int kPointItemStaged = 7;  // block 0 only: its first w_uv item's input combined
constexpr int kPointChunksWeighed = 8;  // block 0 only: that item's chunk weights (weigh_chunks)
// Block 0's attention tiles (the MLA attention phase, attn_phase_mma): the
// wait for a tile to land, the mmas between the two barriers, the second
// barrier and the softmax (summed over its tiles by the bench).
constexpr int kPointTileWait = 6, kPointTileMma = 7, kPointTileSoftmax = 8;
KT_DEV void stamp_event(Ctx& c, int event, unsigned long long at = 0) {
  stamp(c, c.layer, event, true);
  stamp_all_blocks(c, at);
}

// A grid barrier in two halves: the block's arrival, then the wait for the
// others (a block can work in between: barrier_before).
// Profile: the block's arrival at a phase's end, with or without a grid
// barrier there.
KT_DEV void mark_arrival(Ctx& c) {
  stamp(c, c.layer, kPhaseBarrier);
  stamp_arrival(c);
}
KT_DEV void barrier_arrive(Ctx& c) {
  mark_arrival(c);
  kt_grid_arrive<KT_BARRIER>(&c.s->bar, &c.target);
}
KT_DEV void barrier_wait(Ctx& c) { kt_grid_wait<KT_BARRIER>(&c.s->bar, &c.target); }
KT_DEV void barrier(Ctx& c) {
  barrier_arrive(c);
  barrier_wait(c);
}

// ---- small block-wide helpers -------------------------------------------------------
// Thread 0 adds v to a counter that other blocks wait on, after the block's
// writes (call after a block barrier: cumulativity, as in a grid sync).
// KT_HANDOFF 1: one release atomic; 0: a fence, then a relaxed atomic.
KT_DEV void publish(Ctx& c, unsigned* counter, unsigned v) {
  if (c.tid != 0) return;
#if KT_HANDOFF == 1
  kt_red_release_add(counter, v);
#else
  __threadfence();
  atomicAdd(counter, v);
#endif
}

// Waits until a counter that publish() adds to reaches `target`.
KT_DEV void wait_for(Ctx& c, const unsigned* counter, unsigned target) {
  if (c.tid == 0)
    while (kt_ld_acquire(counter) < target) __nanosleep(32);
  kt_block_sync();
}

// KT_FEED 4: thread 0 tells the loader warp that a shared-memory flag
// reached v (call after a block barrier: what the block wrote before it is
// then visible to the loader, which reads the flag with loader_wait).
KT_DEV void signal_loader(Ctx& c, unsigned* flag, unsigned v) {
#if KT_FEED == 4
  if (c.tid == 0) {
    __threadfence_block();
    *reinterpret_cast<volatile unsigned*>(flag) = v;
  }
#else
  (void)c;
  (void)flag;
  (void)v;
#endif
}
// `nap`: ns between polls (a long wait may poll seldom, leaving the SM's
// issue slots to the consumers).
KT_DEV void loader_wait(const unsigned* flag, unsigned target, unsigned nap = 20) {
  while (*reinterpret_cast<const volatile unsigned*>(flag) < target) __nanosleep(nap);
  __threadfence_block();
}

KT_DEV float block_sum(Smem* sm, int tid, float v) {
  v = kt_warp_sum(v);
  kt_block_sync();
  if (tid % 32 == 0) sm->bsum[tid / 32] = v;
  kt_block_sync();
  float t = 0;
  for (int w = 0; w < WARPS; ++w) t += sm->bsum[w];
  return t;
}
KT_DEV float block_sum(Ctx& c, float v) { return block_sum(c.sm, c.tid, v); }

KT_DEV float block_max(Ctx& c, float v) {
  v = kt_warp_max(v);
  kt_block_sync();
  if (c.lane == 0) c.sm->bsum[c.warp] = v;
  kt_block_sync();
  float t = -INFINITY;
  for (int w = 0; w < WARPS; ++w) t = fmaxf(t, c.sm->bsum[w]);
  return t;
}

// Staging an input vector: every thread first issues all of its 16-byte
// loads, then uses them, so a block pays one round trip to L2, not one per
// loop trip.
__host__ __device__ constexpr int cdiv(int a, int b) { return (a + b - 1) / b; }
constexpr int kNormLoads = cdiv(D / 8, THREADS);              // 16-byte loads per thread, RMSNorm
constexpr int kVecLoads = cdiv(cmax(C, MO) / 8, THREADS);     // and a staged bf16 vector

#if KT_FLOW
// KT_FLOW 1: the inputs of o_proj, the MoE gate/up and a layer's first
// phase (o, h, x) are written as words that carry their own validity,
// bf16 value << 16 | tag, and that phase's staging polls them instead of
// waiting at a grid barrier and then loading them: one L2 round trip for
// the data and its readiness, as for the router's logits (RESULTS, run
// 205). The tag names the launch and the layer that wrote the word: 1 +
// (launches before * layers + layer) mod 65535, never 0 (the runner's
// zeroed scratch) and unlike any (launch, layer) near it, so a word from an
// earlier layer or launch is never taken for this one's. What the removed
// barriers ordered besides these inputs stays ordered:
// - a buffer's next write (the next layer's) comes after that layer's
//   remaining grid barrier (before KDA, or before q_abs), which no block
//   passes before every block has staged this layer's words;
// - k-split partials and counters: consecutive GEMV phases use alternate
//   halves (flow_half), so one phase's gatherer marking or resetting them
//   never races with the next phase's items, which no barrier now follows;
// - the MoE gate/up sums a layer zeroes for the next: after that barrier
//   (zero_spent_gu), when every block's down phase before has read them.
KT_DEV unsigned flow_tag(const Ctx& c, int layer) {
  return 1u + (c.epoch * unsigned(KT_LAYERS) + unsigned(layer)) % 65535u;
}
KT_DEV void flow_put(const Ctx& c, unsigned* word, uint16_t v) {
  for (int i = 0; i < 64 * KT_FLOW_LATE; ++i) __nanosleep(1000);
  kt_st_relaxed(word, unsigned(v) << 16 | c.tag);
}

// v[i] = the 8 values of tagged words [8 u, 8 u + 8), as bf16 pairs, for
// this thread's u = c.tid + i * THREADS < n8, once each word carries `tag`.
// Warp 0 first waits for the last word of every aligned 32 (each is one
// producer warp's store: KDA's, an epilogue's), one load a group, so the
// grid's polls put ~130 loads a round on each of the vector's L2 lines
// rather than ~1000 (every thread polling its own words: RESULTS, run 223;
// the two measured alike, run 224). Then every thread loads its words, and
// loads again any not yet written.
constexpr int kFlowGroupLoads = cdiv(cdiv(cmax(C, MO), 32), 32);  // groups of 32 words a lane
template <int PER>
KT_DEV void poll_tagged(const Ctx& c, const unsigned* src, int n8, unsigned tag, uint4 (&v)[PER]) {
  if (c.warp == 0) {
    const int groups = n8 / 4;
    for (;;) {
      unsigned last[kFlowGroupLoads];
#pragma unroll
      for (int i = 0; i < kFlowGroupLoads; ++i) {
        const int g = c.lane + 32 * i;
        last[i] = g < groups ? kt_ld_relaxed(src + 32 * g + 31) : tag;
      }
      bool written = true;
#pragma unroll
      for (int i = 0; i < kFlowGroupLoads; ++i) written = written && (last[i] & 0xffffu) == tag;
      if (__all_sync(0xffffffffu, written)) break;
      __nanosleep(64);
    }
  }
  kt_block_sync();
  const uint4* s4 = reinterpret_cast<const uint4*>(src);
  uint4 w[PER][2];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int u = c.tid + i * THREADS;
    if (u < n8) w[i][0] = kt_ld_relaxed_v4(s4 + 2 * u), w[i][1] = kt_ld_relaxed_v4(s4 + 2 * u + 1);
  }
  auto tagged = [tag](const uint4& q) {
    return ((q.x & 0xffffu) == tag) & ((q.y & 0xffffu) == tag) & ((q.z & 0xffffu) == tag) & ((q.w & 0xffffu) == tag);
  };
  for (;;) {
    bool all = true;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int u = c.tid + i * THREADS;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (u < n8 && !tagged(w[i][h])) {
          all = false;
          w[i][h] = kt_ld_relaxed_v4(s4 + 2 * u + h);
        }
    }
    if (all) break;
    __nanosleep(32);
  }
  auto pair = [](unsigned lo, unsigned hi) { return (lo >> 16) | (hi & 0xffff0000u); };
#pragma unroll
  for (int i = 0; i < PER; ++i)
    v[i] = make_uint4(pair(w[i][0].x, w[i][0].y), pair(w[i][0].z, w[i][0].w), pair(w[i][1].x, w[i][1].y),
                      pair(w[i][1].z, w[i][1].w));
}
#endif

// xs = RMSNorm(x, w) as bf16 pairs, from x's and w's 16-byte pieces
// (this thread's: c.tid + i * THREADS).
template <int PER>
KT_DEV void rmsnorm_to_xs(Smem* sm, int tid, const uint4 (&xv)[PER], const uint4 (&wv)[PER]) {
  constexpr int V = D / 8;
  float ss = 0;
#pragma unroll
  for (int i = 0; i < PER; ++i)
    if (tid + i * THREADS < V)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t p = word_of(xv[i], j);
        ss += kt_lo(p) * kt_lo(p) + kt_hi(p) * kt_hi(p);
      }
  const float inv = rsqrtf(block_sum(sm, tid, ss) / float(D) + float(KT_EPS));
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int v = tid + i * THREADS;
    if (v < V)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t p = word_of(xv[i], j), q = word_of(wv[i], j);
        sm->xs_hi[4 * v + j] = kt_pack(kt_lo(p) * inv * kt_lo(q), kt_hi(p) * inv * kt_hi(q));
        sm->xs_lo[4 * v + j] = 0;
      }
  }
  kt_block_sync();
}

// xs = RMSNorm(x, w), x written before a grid barrier of this launch.
// KT_HELPERS 1: one out-of-line copy (KT_HELPER).
KT_HELPER void rmsnorm_plain(Smem* sm, int tid, const uint16_t* x, const uint16_t* w) {
  constexpr int V = D / 8, PER = kNormLoads;  // 8 values per 16-byte load
  uint4 xv[PER], wv[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int v = tid + i * THREADS;
    if (v < V) {
      xv[i] = kt_ld_cg(reinterpret_cast<const uint4*>(x) + v);
      wv[i] = kt_ld_weights<0>(reinterpret_cast<const uint4*>(w) + v);
    }
  }
  rmsnorm_to_xs(sm, tid, xv, wv);
}

// xs = RMSNorm(x, w); x was written earlier in this launch (KT_FLOW 1:
// tagged, by the layer whose flow_tag is `tag`; nullptr: plain, after a
// grid barrier).
KT_DEV void stage_rmsnorm(Ctx& c, const uint16_t* x, const uint16_t* w, const unsigned* tagged = nullptr,
                          unsigned tag = 0) {
#if KT_FLOW
  if (tagged) {
    constexpr int V = D / 8, PER = kNormLoads;
    uint4 xv[PER], wv[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int v = c.tid + i * THREADS;
      if (v < V) wv[i] = kt_ld_weights<0>(reinterpret_cast<const uint4*>(w) + v);
    }
    poll_tagged(c, tagged, V, tag, xv);
    rmsnorm_to_xs(c.sm, c.tid, xv, wv);
    return;
  }
#else
  (void)tagged;
  (void)tag;
#endif
  rmsnorm_plain(c.sm, c.tid, x, w);
}

// KT_REDUCE 1: the vector a carried phase (o_proj, down) would have written,
// h[n] = bf16(res[n] + bf16(y[n])) with y its items' atomically added sums,
// then RMSNorm(h) * w into xs as stage_rmsnorm does. Block 0 writes h to
// `out` for the phases after (read only after another grid barrier). All
// loads are issued before the first is used: one round trip to L2.
constexpr int kCarriedCols = cdiv(D, THREADS);  // columns per thread
KT_DEV void stage_carried(Ctx& c, const float* sums, const uint16_t* res, const uint16_t* w, uint16_t* out) {
  constexpr int PE = kCarriedCols;
  float y[PE];
  uint16_t r[PE], wv[PE];
#pragma unroll
  for (int e = 0; e < PE; ++e) {
    const int n = c.tid + e * THREADS;
    y[e] = n < D ? kt_ld_cg(sums + n) : 0.0f;
    r[e] = n < D ? kt_ld_cg(res + n) : uint16_t(0);
    wv[e] = n < D ? w[n] : uint16_t(0);
  }
  float h[PE], ss = 0;
#pragma unroll
  for (int e = 0; e < PE; ++e) {
    h[e] = kt_bf2f(kt_f2bf(kt_bf2f(r[e]) + kt_round_bf16(y[e])));
    ss += c.tid + e * THREADS < D ? h[e] * h[e] : 0.0f;
  }
  const float inv = rsqrtf(block_sum(c, ss) / float(D) + float(KT_EPS));
  uint16_t* xs = reinterpret_cast<uint16_t*>(c.sm->xs_hi);
#pragma unroll
  for (int e = 0; e < PE; ++e) {
    const int n = c.tid + e * THREADS;
    if (n < D) {
      xs[n] = kt_f2bf(h[e] * inv * kt_bf2f(wv[e]));
      if (blockIdx.x == 0) out[n] = kt_f2bf(h[e]);
    }
  }
  for (int i = c.tid; i < D / 2; i += THREADS) c.sm->xs_lo[i] = 0;
  kt_block_sync();
}

// The input of a phase that opens a residual block: RMSNorm(vec) * w into
// xs; or, when the phase before left its sums (KT_REDUCE 1), vec computed
// from them and the residual `res`, and written to `out`; with KT_FLOW 1
// and `tagged`, vec's tagged words (stage_rmsnorm).
KT_DEV void stage_block_input(Ctx& c, const uint16_t* vec, const uint16_t* res, const uint16_t* w, uint16_t* out,
                              const unsigned* tagged = nullptr, unsigned tag = 0) {
  if (c.carried)
    stage_carried(c, c.carried, res, w, out);
  else
    stage_rmsnorm(c, vec, w, tagged, tag);
  c.carried = nullptr;
}

// xs = a bf16 vector of n (<= max(C, MO)) values written earlier in this
// launch (tagged, tag: as stage_rmsnorm's).
KT_DEV void stage_bf16(Ctx& c, const uint16_t* x, int n, const unsigned* tagged = nullptr, unsigned tag = 0) {
  constexpr int PER = kVecLoads;
  uint4 xv[PER];
#if KT_FLOW
  if (tagged) poll_tagged(c, tagged, n / 8, tag, xv);
#else
  (void)tag;
#endif
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int v = c.tid + i * THREADS;
    if (v < n / 8 && !tagged) xv[i] = kt_ld_cg(reinterpret_cast<const uint4*>(x) + v);
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int v = c.tid + i * THREADS;
    if (v < n / 8) {
      reinterpret_cast<uint4*>(c.sm->xs_hi)[v] = xv[i];
      reinterpret_cast<uint4*>(c.sm->xs_lo)[v] = make_uint4(0, 0, 0, 0);
    }
  }
  kt_block_sync();
}

// Stores an fp32 pair as hi + lo bf16 parts.
KT_DEV void stage_f32_pair(Ctx& c, int p, float v0, float v1) {
  uint32_t hi = kt_pack(v0, v1);
  c.sm->xs_hi[p] = hi;
  c.sm->xs_lo[p] = kt_pack(v0 - kt_lo(hi), v1 - kt_hi(hi));
}

// ---- the W4A16 GEMV engine ------------------------------------------------------------
struct Seg {
  const uint8_t* wq;
  const uint16_t* sc;
  const uint16_t* ze;
  int N;   // columns of the matrix (bytes per packed row pair)
  int n0;  // the tile's first column in the matrix
#if KT_FEED >= 1
  size_t rp;   // the matrix's first stage in the repacked weights (bytes; the layout below)
  int groups;  // its quantization groups (K / G): stages per tile
#endif
};
// A segment; rp and groups only where the bulk feed reads the repacked
// copy (elsewhere they would cost registers wherever a Seg is passed).
KT_DEV Seg make_seg(const uint8_t* wq, const uint16_t* sc, const uint16_t* ze, int N, int n0, size_t rp, int groups) {
#if KT_FEED >= 1
  return Seg{wq, sc, ze, N, n0, rp, groups};
#else
  (void)rp;
  (void)groups;
  return Seg{wq, sc, ze, N, n0};
#endif
}

// ---- the repacked weights (KT_FEED > 0) -----------------------------------------
// The bulk feed reads every GEMV matrix from a copy repacked once per load
// (the prepare kernel, ktune_k1) into stages laid out as the shared-memory
// Stage, in the order KT_REPACK_ORDER names (repack_at). The
// copy sits in scratch after Scratch, matrices in a fixed order per layer:
// the attention's (K: q, k, v, g, o; M: q, kv_a, kv_b, o), then the MoE's
// (gate, up and down of each routed expert, then of each shared one).
// KT_REPACK_ORDER: where stage (tile, group) of a matrix lies in its copy.
// 0: [ceil(N / TILE) tiles][K / G groups], an item's stages one run of its
// tile's. 1: [groups][tiles], the same group of neighbouring tiles side by
// side, so the blocks of a phase, each streaming its own item, read a few
// runs at a time instead of ~132 streams 26-157 KB apart. Measured equal
// (RESULTS, run 315): in the step_shape study, streams 26-157 KB apart (tile
// order's) are as fast as side by side, only 1.9 MB apart are 5% slower
// (run 314); the megakernel steps as fast in either order. Default 0; the
// search may weigh 1 on other GPUs.
__host__ __device__ constexpr size_t repack_at(int N, int groups, int tile, int grp) {
  return (KT_REPACK_ORDER == 1 ? size_t(grp) * size_t(cdiv(N, TILE)) + size_t(tile)
                               : size_t(tile) * size_t(groups) + size_t(grp)) *
         sizeof(Stage);
}
// From a tile's stage of one group to its next group's.
__host__ __device__ constexpr size_t repack_group_step(int N) {
  return (KT_REPACK_ORDER == 1 ? size_t(cdiv(N, TILE)) : size_t(1)) * sizeof(Stage);
}
__host__ __device__ constexpr size_t repack_bytes(int K, int N) { return size_t(cdiv(N, TILE)) * size_t(K / G) * sizeof(Stage); }
__host__ __device__ constexpr bool m_layer(int l) { return ((KT_PATTERN_M >> l) & 1) != 0; }
constexpr size_t kKdaRepack = 4 * repack_bytes(D, C) + repack_bytes(C, D);
constexpr size_t kMlaQ = 0, kMlaKva = repack_bytes(D, QDIM), kMlaKvb = kMlaKva + repack_bytes(D, KVA),
                 kMlaO = kMlaKvb + repack_bytes(R, KVB), kMlaRepack = kMlaO + repack_bytes(MO, D);
constexpr size_t kExpertIn = repack_bytes(D, I), kExpertOut = repack_bytes(I, D);
constexpr size_t kMoeRepack = size_t(E + NSH) * (2 * kExpertIn + kExpertOut);
// The MoE part's matrices: routed gate, up, down (expert e), then shared.
__host__ __device__ constexpr size_t moe_repack(bool shared, int which, int e) {
  const size_t base = shared ? size_t(E) * (2 * kExpertIn + kExpertOut) : 0, n = shared ? NSH : E;
  return base + (which == 0 ? 0 : which == 1 ? n * kExpertIn : 2 * n * kExpertIn) +
         size_t(e) * (which == 2 ? kExpertOut : kExpertIn);
}
__host__ __device__ constexpr size_t attn_repack_bytes(int l) { return m_layer(l) ? kMlaRepack : kKdaRepack; }
// Layer l's first stage (its attention part; its MoE part follows).
__host__ __device__ constexpr size_t layer_repack(int l) {
  size_t at = 0;
  for (int i = 0; i < l; ++i) at += attn_repack_bytes(i) + kMoeRepack;
  return at;
}
__host__ __device__ constexpr size_t moe_layer_repack(int l) { return layer_repack(l) + attn_repack_bytes(l); }
static_assert(sizeof(Scratch) < (1u << 30), "scratch offsets fit an int");
constexpr size_t kRepackOffset = size_t(cdiv(int(sizeof(Scratch)), 128)) * 128;  // in scratch
constexpr size_t kRepackBytes = layer_repack(KT_LAYERS);
static_assert(sizeof(Stage) == 8704 && sizeof(Stage) % 16 == 0, "a stage is one 8.5-KB bulk copy");

// The raw scales and zeros of this lane group's 16 columns at group `grp`
// (four 16-byte loads, issued early), and their expansion to packed pairs
// ss = (s, s), zz = (128 + z, 128 + z) once they arrive.
struct RawScales {
  uint4 s[2], z[2];
};

KT_DEV RawScales fetch_scales(const Seg& sg, int grp, int col, bool active) {
  RawScales r = {{{0, 0, 0, 0}, {0, 0, 0, 0}}, {{0, 0, 0, 0}, {0, 0, 0, 0}}};
  if (active) {
    const size_t off = size_t(grp) * sg.N + col;
    r.s[0] = kt_ld_weights<KT_LOAD_HINT>(sg.sc + off);
    r.s[1] = kt_ld_weights<KT_LOAD_HINT>(sg.sc + off + 8);
    r.z[0] = kt_ld_weights<KT_LOAD_HINT>(sg.ze + off);
    r.z[1] = kt_ld_weights<KT_LOAD_HINT>(sg.ze + off + 8);
  }
  return r;
}

// A lane's 16 columns' scales and (128 + zero)s as packed words, two columns
// per word (kt_dequant_half reads either half): ss[i] and zz[i] hold
// columns 2i and 2i + 1. Zero for an inactive lane.
KT_DEV void expand_scales(const RawScales& r, bool active, uint32_t (&ss)[8], uint32_t (&zz)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t sw = word_of(r.s[i / 4], i % 4), zw = word_of(r.z[i / 4], i % 4);
    ss[i] = active ? sw : 0u;
    zz[i] = active ? kt_hsub2(zw, 0xc300c300u) : 0u;  // z - (-128), exact for z in 0..15
  }
}

// Column b of a lane's 16 (b known at compile time after unrolling).
KT_DEV uint32_t dequant_col(uint32_t pair, const uint32_t (&ss)[8], const uint32_t (&zz)[8], int b) {
  return (b & 1) ? kt_dequant_half<1>(pair, zz[b / 2], ss[b / 2]) : kt_dequant_half<0>(pair, zz[b / 2], ss[b / 2]);
}

KT_DEV void load_scales(const Seg& sg, int grp, int col, bool active, uint32_t (&ss)[8], uint32_t (&zz)[8]) {
  expand_scales(fetch_scales(sg, grp, col, active), active, ss, zz);
}

// The same from a group's 128 raw scales and zeros in shared memory (lane
// group g takes columns 16 g .. 16 g + 15).
KT_DEV void expand_smem_scales(const uint16_t* sc, const uint16_t* ze, int g, bool active, uint32_t (&ss)[8],
                               uint32_t (&zz)[8]) {
  const uint4* sv = reinterpret_cast<const uint4*>(sc + 16 * g);
  const uint4* zv = reinterpret_cast<const uint4*>(ze + 16 * g);
  expand_scales(RawScales{{sv[0], sv[1]}, {zv[0], zv[1]}}, active, ss, zz);
}

// bf16 (128, 128), read from memory once per segment: in a register it lets
// kt_nibble_pair's mask-and-bias be one LOP3 instead of two (ptxas folds a
// literal into the instruction; the GEMV engine's v7 measured it). Written
// nowhere.
__device__ uint32_t g_bias_pair = 0x43004300u;

// One 16-row chunk for this warp: wa/wb are the lane's 16 bytes at k-pairs
// t and t+4 (16 columns), ss/zz its columns' scales and (128 + zero)s two
// columns per word (expand_scales), and lc the chunk's index into the
// staged input x.
KT_DEV void chunk_compute(const uint4& wa, const uint4& wb, const uint32_t (&ss)[8], const uint32_t (&zz)[8],
                          uint32_t bias, const uint32_t* xh, const uint32_t* xl, int lc, float (&acc)[16],
                          float (&mma_acc)[8][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#if KT_DEQUANT == 1
  (void)acc;
  // B column 0 = hi part of x, column 1 = lo part, the rest zero.
  const uint32_t* xsrc = g == 0 ? xh : xl;
  uint32_t b[2] = {g < 2 ? xsrc[lc * 8 + t] : 0u, g < 2 ? xsrc[lc * 8 + t + 4] : 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int wi = j >> 1, b0 = (j & 1) * 2;
    const uint32_t A = word_of(wa, wi), B = word_of(wb, wi);
    const uint32_t As = A >> 4, Bs = B >> 4;
    uint32_t a[4] = {dequant_col(kt_nibble_pair(A, As, b0, bias), ss, zz, 2 * j),
                     dequant_col(kt_nibble_pair(A, As, b0 + 1, bias), ss, zz, 2 * j + 1),
                     dequant_col(kt_nibble_pair(B, Bs, b0, bias), ss, zz, 2 * j),
                     dequant_col(kt_nibble_pair(B, Bs, b0 + 1, bias), ss, zz, 2 * j + 1)};
    kt_mma_bf16(mma_acc[j], a, b);
  }
#else
  (void)mma_acc;
  (void)g;
  const uint32_t ha = xh[lc * 8 + t], la = xl[lc * 8 + t];
  const uint32_t hb = xh[lc * 8 + t + 4], lb = xl[lc * 8 + t + 4];
  const float xa0 = kt_lo(ha) + kt_lo(la), xa1 = kt_hi(ha) + kt_hi(la);
  const float xb0 = kt_lo(hb) + kt_lo(lb), xb1 = kt_hi(hb) + kt_hi(lb);
#pragma unroll
  for (int bi = 0; bi < 16; ++bi) {
    const uint32_t A = word_of(wa, bi >> 2), B = word_of(wb, bi >> 2);
    const uint32_t pa = dequant_col(kt_nibble_pair(A, A >> 4, bi & 3, bias), ss, zz, bi);
    const uint32_t pb = dequant_col(kt_nibble_pair(B, B >> 4, bi & 3, bias), ss, zz, bi);
    acc[bi] += xa0 * kt_lo(pa) + xa1 * kt_hi(pa) + xb0 * kt_lo(pb) + xb1 * kt_hi(pb);
  }
#endif
}

// KT_FEED > 0: the same from a repacked stage's chunk (repack_stage): word j
// of the lane's 32 bytes holds mma j's four A registers as nibbles r
// (bits 4r) and r + 4 (bits 4r + 16), so a register is a shift and a LOP3.
KT_DEV void chunk_compute_frag(const uint4& wa, const uint4& wb, const uint32_t (&ss)[8], const uint32_t (&zz)[8],
                               uint32_t bias, const uint32_t* xh, const uint32_t* xl, int lc,
                               float (&mma_acc)[8][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t* xsrc = g == 0 ? xh : xl;
  uint32_t b[2] = {g < 2 ? xsrc[lc * 8 + t] : 0u, g < 2 ? xsrc[lc * 8 + t + 4] : 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t w = word_of(j < 4 ? wa : wb, j & 3);
    uint32_t a[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = dequant_col(((r == 0 ? w : w >> (4 * r)) & 0x000f000fu) | bias, ss, zz, 2 * j + (r & 1));
    kt_mma_bf16(mma_acc[j], a, b);
  }
}

// Register path (KT_STAGES 0). A warp takes a range of an item's chunks,
// one matrix segment at a time, KT_UNROLL chunks per batch of loads. With
// KT_PIPELINE the next batch is issued before the current one is computed
// (two register buffers), so a warp always has loads in flight.
constexpr int U = KT_UNROLL;

// Issues the loads of chunks [l, l + U) of segment sg (zeros from l1 on).
KT_DEV void load_batch(const Seg& sg, int l, int l1, uint4 (&wa)[U], uint4 (&wb)[U]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int col = sg.n0 + 16 * g;
  const bool active = col < sg.N;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int lc = l + u;
    if (lc < l1 && active) {
      const uint8_t* w = sg.wq + col + (size_t(lc) * 8 + t) * sg.N;
      wa[u] = kt_ld_weights<KT_LOAD_HINT>(w);
      wb[u] = kt_ld_weights<KT_LOAD_HINT>(w + 4 * size_t(sg.N));
    } else {
      wa[u] = make_uint4(0, 0, 0, 0);
      wb[u] = make_uint4(0, 0, 0, 0);
    }
  }
}

// Computes chunks [l, l + U) of segment sg (stopping at l1). gs: the scales
// of group grp of the segment are at gs[grp] in shared memory (KT_SCALES 1).
// xh/xl: the segment's first k-pair of the staged input.
KT_DEV void compute_batch(const Seg& sg, int l, int l1, const uint16_t (*gs)[2][TILE], const uint32_t* xh,
                          const uint32_t* xl, const uint4 (&wa)[U], const uint4 (&wb)[U], int& cur_group,
                          RawScales& ahead, uint32_t (&ss)[8], uint32_t (&zz)[8], uint32_t bias,
                          float (&acc)[16], float (&mma_acc)[8][4]) {
  const int g = (threadIdx.x & 31) >> 2, col = sg.n0 + 16 * g;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int lc = l + u;
    if (lc >= l1) break;
    const int grp = lc / STAGE_CHUNKS;
    if (grp != cur_group) {
      cur_group = grp;
#if KT_SCALES == 1
      (void)ahead;
      expand_smem_scales(gs[grp][0], gs[grp][1], g, col < sg.N, ss, zz);
#elif KT_SCALES == 2
      (void)gs;
      expand_scales(ahead, col < sg.N, ss, zz);
      if (grp < (l1 - 1) / STAGE_CHUNKS) ahead = fetch_scales(sg, grp + 1, col, col < sg.N);
#else
      (void)gs;
      (void)ahead;
      load_scales(sg, grp, col, col < sg.N, ss, zz);
#endif
    }
    chunk_compute(wa[u], wb[u], ss, zz, bias, xh, xl, lc, acc, mma_acc);
  }
}

// Accumulates chunks [l0, l1) of one segment.
KT_DEV void gemv_segment(const Seg& sg, int l0, int l1, const uint16_t (*gs)[2][TILE], const uint32_t* xh,
                         const uint32_t* xl, float (&acc)[16], float (&mma_acc)[8][4]) {
  uint32_t ss[8], zz[8];
  int cur_group = -1;
  const uint32_t bias = g_bias_pair;
#if KT_SCALES == 2
  // The first group's scales go out with the first weights; each group's
  // expansion then fetches the next one's (see compute_batch).
  const int col = sg.n0 + 16 * ((threadIdx.x & 31) >> 2);
  RawScales ahead = fetch_scales(sg, l0 / STAGE_CHUNKS, col, col < sg.N);
#else
  RawScales ahead;
#endif
  uint4 wa0[U], wb0[U];
  load_batch(sg, l0, l1, wa0, wb0);
#if KT_PIPELINE
  uint4 wa1[U], wb1[U];
  for (int l = l0; l < l1; l += 2 * U) {
    load_batch(sg, l + U, l1, wa1, wb1);
    compute_batch(sg, l, l1, gs, xh, xl, wa0, wb0, cur_group, ahead, ss, zz, bias, acc, mma_acc);
    if (l + U >= l1) break;
    load_batch(sg, l + 2 * U, l1, wa0, wb0);
    compute_batch(sg, l + U, l1, gs, xh, xl, wa1, wb1, cur_group, ahead, ss, zz, bias, acc, mma_acc);
  }
#else
  for (int l = l0; l < l1; l += U) {
    compute_batch(sg, l, l1, gs, xh, xl, wa0, wb0, cur_group, ahead, ss, zz, bias, acc, mma_acc);
    if (l + U < l1) load_batch(sg, l + U, l1, wa0, wb0);
  }
#endif
}

// KT_SCALES 1: the scales and zeros of the item's groups [kc0 / 8,
// ceil(kc1 / 8)), copied into shared memory while its input is staged (one
// cp.async commit group).
template <class P>
KT_DEV void stage_scales(Ctx& c, const P& p, int tile, int kc0, int kc1) {
  const int gps = p.seg_chunks(tile) / STAGE_CHUNKS;  // groups per segment
  const int gg0 = kc0 / STAGE_CHUNKS, gg1 = (kc1 + STAGE_CHUNKS - 1) / STAGE_CHUNKS;
  // 16-byte pieces: per group, 16 of scales then 16 of zeros (128 columns).
  for (int i = c.tid; i < (gg1 - gg0) * 32; i += THREADS) {
    const int gg = gg0 + i / 32, which = (i / 16) & 1, piece = i % 16;
    const Seg sg = p.seg(tile, gg / gps);
    const int col = sg.n0 + piece * 8;
    const bool valid = col < sg.N;
    const uint16_t* src = (which ? sg.ze : sg.sc) + size_t(gg % gps) * sg.N + col;
    kt_cp_async16(&c.sm->gscale[gg - gg0][which][piece * 8], valid ? src : sg.sc, valid);
  }
  kt_cp_async_commit();
}

KT_DEV void gemv_finish(float (&acc)[16], float (&mma_acc)[8][4], float (&out)[16]);

// KT_GEMV_CODE 1: every phase's register-path GEMV runs this one out-of-line
// copy of the loop, which adds the segment's sums to the warp's row of
// c.sm->red (lanes t == 0 hold columns 16 g .. 16 g + 15). Inlined, the
// loop is in the kernel 8 times (~800 instructions each); ncu found the warps
// of phases that run once per layer waiting on instruction fetch (RESULTS,
// run 56).
__device__ __noinline__ void gemv_segment_shared(Seg sg, int l0, int l1, const uint16_t (*gs)[2][TILE],
                                                 const uint32_t* xh, const uint32_t* xl, float* red_row) {
  float acc[16], mma_acc[8][4], out[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) mma_acc[j][0] = mma_acc[j][1] = mma_acc[j][2] = mma_acc[j][3] = 0;
  gemv_segment(sg, l0, l1, gs, xh, xl, acc, mma_acc);
  gemv_finish(acc, mma_acc, out);
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  if (t == 0) {
#pragma unroll
    for (int b = 0; b < 16; ++b) red_row[16 * g + b] += out[b];
  }
}

// KT_GEMV_CODE 2, the lean loop: gemv_segment_shared's work (scales one
// group ahead, KT_UNROLL chunks per batch, two batches in flight) with
// fewer instructions around the dequant. Run 83's SASS of the shared loop
// has ~263 instructions per chunk, 136 of them the dequant and the mma; the
// rest computes predicated addresses, zeroes load registers, moves the
// cache policy into uniform registers under each load's predicate, and
// divides to find the group. Here no load has a predicate: chunk indices
// past the warp's range are clamped to its last chunk (those loads are
// never computed), and a lane past the matrix's last column (a tile at the
// edge of kv_a's 576 columns) streams column 0 with its scales zeroed. A
// chunk's address is one multiply-add from the lane's row pointer, and the
// group changes at a chunk index kept in a register.
struct LeanRows {
  const uint8_t* a;  // the lane's row pair t of chunk 0 (16 columns)
  const uint8_t* b;  // its row pair t + 4
  uint32_t step;     // bytes per chunk, 8 row pairs
  int last;          // the warp's last chunk
};

// Chunks past the warp's last are clamped to it: every load is issued and
// in bounds, none is computed twice (lean_compute stops at l1). Skipping
// them by a branch instead measured +26 us (run 95): ptxas then spilled at
// the loop's call sites.
KT_DEV void lean_load(const LeanRows& r, int l, uint4 (&wa)[U], uint4 (&wb)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const uint32_t i = uint32_t(l + u < r.last ? l + u : r.last);
    wa[u] = kt_ld_weights<KT_LOAD_HINT>(r.a + size_t(i) * r.step);
    wb[u] = kt_ld_weights<KT_LOAD_HINT>(r.b + size_t(i) * r.step);
  }
}

// The scales of the group that chunk lc opens take over (they were fetched
// a group ahead), and the next group's are fetched.
struct LeanScales {
  RawScales ahead;
  uint32_t ss[8], zz[8];
  int next;  // the first chunk of the next group
};

KT_DEV void lean_enter_group(LeanScales& s, const Seg& sg, int col, uint32_t amask, int lc, int last_group) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    s.ss[i] = word_of(s.ahead.s[i / 4], i % 4) & amask;
    s.zz[i] = kt_hsub2(word_of(s.ahead.z[i / 4], i % 4), 0xc300c300u);  // z - (-128), exact
  }
  const int grp = lc >> 3;  // STAGE_CHUNKS chunks per group (static_assert below)
  s.ahead = fetch_scales(sg, grp < last_group ? grp + 1 : last_group, col, true);
  s.next = (grp + 1) * STAGE_CHUNKS;
}

KT_DEV void lean_compute(const Seg& sg, int col, uint32_t amask, int l, int l1, int last_group, LeanScales& s,
                         const uint4 (&wa)[U], const uint4 (&wb)[U], uint32_t bias, const uint32_t* xh,
                         const uint32_t* xl, float (&acc)[16], float (&mma_acc)[8][4]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int lc = l + u;
    if (lc >= l1) break;
    if (lc == s.next) lean_enter_group(s, sg, col, amask, lc, last_group);
    chunk_compute(wa[u], wb[u], s.ss, s.zz, bias, xh, xl, lc, acc, mma_acc);
  }
}

static_assert(STAGE_CHUNKS == 8, "lean_enter_group's shift");

__device__ __noinline__ void gemv_segment_lean(Seg sg, int l0, int l1, const uint32_t* xh, const uint32_t* xl,
                                               float* red_row) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bool active = sg.n0 + 16 * g < sg.N;
  const int col = active ? sg.n0 + 16 * g : 0;
  const uint32_t amask = active ? ~0u : 0u;
  LeanRows rows;
  rows.a = sg.wq + col + size_t(t) * uint32_t(sg.N);
  rows.b = rows.a + size_t(4) * uint32_t(sg.N);
  rows.step = 8 * uint32_t(sg.N);
  rows.last = l1 - 1;
  const int last_group = rows.last >> 3;
  const uint32_t bias = g_bias_pair;
  float acc[16], mma_acc[8][4], out[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) mma_acc[j][0] = mma_acc[j][1] = mma_acc[j][2] = mma_acc[j][3] = 0;
  LeanScales s;
  s.ahead = fetch_scales(sg, l0 >> 3, col, true);
  s.next = l0;  // the first chunk opens its group
  uint4 wa0[U], wb0[U], wa1[U], wb1[U];
  lean_load(rows, l0, wa0, wb0);
  for (int l = l0; l < l1; l += 2 * U) {
    lean_load(rows, l + U, wa1, wb1);
    lean_compute(sg, col, amask, l, l1, last_group, s, wa0, wb0, bias, xh, xl, acc, mma_acc);
    if (l + U >= l1) break;
    lean_load(rows, l + 2 * U, wa0, wb0);
    lean_compute(sg, col, amask, l + U, l1, last_group, s, wa1, wb1, bias, xh, xl, acc, mma_acc);
  }
  gemv_finish(acc, mma_acc, out);
  if (t == 0) {
#pragma unroll
    for (int b = 0; b < 16; ++b) red_row[16 * g + b] += out[b];
  }
}

// One item's k range [kc0, kc1): this warp takes an equal share of it.
// KT_GEMV_CODE 1 and 2 leave the sums in c.sm->red[warp] (acc stays zero).
template <class P>
KT_DEV void gemv_registers(Ctx& c, P& p, int tile, int kc0, int kc1, float (&acc)[16], float (&mma_acc)[8][4]) {
#if KT_SCALES == 1
  stage_scales(c, p, tile, kc0, kc1);
#endif
  p.stage(c, tile, kc0, kc1);
#if KT_SCALES == 1
  kt_cp_async_wait<0>();
  kt_block_sync();
#endif
  const int segc = p.seg_chunks(tile), gg0 = kc0 / STAGE_CHUNKS;
  const int wc0 = kc0 + (kc1 - kc0) * c.warp / WARPS, wc1 = kc0 + (kc1 - kc0) * (c.warp + 1) / WARPS;
  for (int kc = wc0; kc < wc1;) {
    const int s = kc / segc, l0 = kc % segc;
    const int l1 = (l0 + (wc1 - kc)) < segc ? (l0 + (wc1 - kc)) : segc;
    const int xoff = s * segc * 8;  // k-pairs before this segment in the tile's input
    // The segment's group 0 in the item's staged scales (may lie before the array).
    const uint16_t(*gs)[2][TILE] = c.sm->gscale + (s * segc / STAGE_CHUNKS - gg0);
#if KT_GEMV_CODE == 2
    (void)gs;
    gemv_segment_lean(p.seg(tile, s), l0, l1, c.sm->xs_hi + xoff, c.sm->xs_lo + xoff, c.sm->red[c.warp]);
#elif KT_GEMV_CODE == 1
    gemv_segment_shared(p.seg(tile, s), l0, l1, gs, c.sm->xs_hi + xoff, c.sm->xs_lo + xoff, c.sm->red[c.warp]);
#else
    gemv_segment(p.seg(tile, s), l0, l1, gs, c.sm->xs_hi + xoff, c.sm->xs_lo + xoff, acc, mma_acc);
#endif
    kc += l1 - l0;
  }
}

// Staged path: all threads copy one group of a tile (64 packed row pairs x
// 128 columns, and its scales and zeros) into a stage, asynchronously.
KT_DEV void issue_stage(Ctx& c, Stage& st, const Seg& sg, int group) {
  const size_t rp0 = size_t(group) * (G / 2);
  for (int i = c.tid; i < (G / 2) * 8; i += THREADS) {
    const int r = i >> 3, cc = i & 7, col = sg.n0 + cc * 16;
    const bool valid = col < sg.N;
    kt_cp_async16(&st.w[r * TILE + ((cc ^ ((r & 3) << 1)) * 16)], valid ? sg.wq + (rp0 + r) * sg.N + col : sg.wq,
                  valid);
  }
  if (c.tid < 32) {
    const int which = c.tid >> 4, cc = c.tid & 15, col = sg.n0 + cc * 8;
    const bool valid = col < sg.N;
    const uint16_t* src = (which ? sg.ze : sg.sc) + size_t(group) * sg.N + col;
    kt_cp_async16((which ? st.ze : st.sc) + cc * 8, valid ? src : sg.sc, valid);
  }
}

// Staged path: the item's groups [g0, g1) stream through KT_STAGES stages;
// warp w takes chunks w, w + WARPS, ... of each stage. The segment of a
// group comes from the phase (several experts form one k range).
// Issues the first STAGES-1 stages of an item (one commit group each).
#if KT_FEED >= 1
// KT_FEED_Q: the chunks of a stage each warp computes (knob feed_chunks);
// the study kernels/kimi/cuda/dev/consumer_rate.cu times the choices.
constexpr int FEED_Q = KT_FEED_Q;
constexpr int FEED_WPG = STAGE_CHUNKS / FEED_Q;  // warps that share a stage
constexpr int FEED_GROUPS = WARPS / FEED_WPG;
static_assert(WARPS % FEED_WPG == 0 && STAGE_CHUNKS % FEED_WPG == 0, "feed: whole warp groups");
// The groups that take an item's stages in turn: the consumers', then the
// light warps' (KT_LIGHT_WARPS), which come last.
constexpr int EAT_GROUPS = FEED_GROUPS + kLightWarps / FEED_WPG;
static_assert(kLightWarps % FEED_WPG == 0, "light warps: whole warp groups (feed_chunks 2 or more)");
// A warp waits for stage k on its slot's full mbarrier by parity, which
// passes as well while the slot's fill before (stage k - STAGES) is still in
// flight; that fill was this warp's own, so landed, only if the groups
// divide the ring (the knobs' constraint says so).
static_assert(STAGES % EAT_GROUPS == 0, "feed: the ring's depth a multiple of the warp groups");
// KT_FEED > 0: thread 0 copies the block's next stage (segment sg's group
// `group`, repacked) into the ring's next slot in one bulk copy, once every
// warp has released what the slot held (its empty mbarrier's last phase).
// The thread that issues the stages: the loader warp's first (KT_FEED 4), else thread 0.
KT_DEV bool feeds(const Ctx& c) { return c.tid == (KT_FEED == 4 ? THREADS : 0); }
KT_DEV void feed_raw(Ctx& c, size_t offset) {
  if (!feeds(c)) return;
  const unsigned slot = c.fed % STAGES, round = c.fed / STAGES;
  if (round > 0) kt_mbar_wait(&c.sm->empty[slot], (round - 1) & 1);
  // The warps' reads of the slot before the copy's writes: the empty
  // mbarrier orders them (as in a TMA pipeline). The bulk feeds also follow
  // the attention's cp.async writes into the same memory without a block-wide
  // fence: this one covers it. The loader's follow attention_done's.
  if (KT_FEED != 4) kt_fence_proxy_async();
#if KT_FEED == 4 && KT_INFLIGHT > 0
  // At most KT_INFLIGHT of the block's copies in flight: the stage issued
  // KT_INFLIGHT before this one has landed. (Its slot's fill is the one it
  // waits for: the fill before it was eaten before that stage was issued.)
  if (c.fed >= unsigned(KT_INFLIGHT)) {
    const unsigned k = c.fed - KT_INFLIGHT;
    kt_mbar_wait(&c.sm->full[k % STAGES], (k / STAGES) & 1);
  }
#endif
  Stage* stages = reinterpret_cast<Stage*>(c.sm->pipe);
  kt_mbar_arrive_expect_tx(&c.sm->full[slot], unsigned(sizeof(Stage)));
  kt_bulk_copy_g2s(&stages[slot], c.a.scratch + offset, unsigned(sizeof(Stage)), &c.sm->full[slot]);
  ++c.fed;
}
// A segment's first stage (of its tile) in scratch.
KT_DEV size_t seg_base(const Seg& sg) { return kRepackOffset + sg.rp + repack_at(sg.N, sg.groups, sg.n0 / TILE, 0); }
// Where stage g of a tile of phase p (its groups counted across segments) is in scratch.
template <class P>
KT_DEV size_t stage_offset(const P& p, int tile, int g) {
  const int seg_groups = p.seg_chunks(tile) / STAGE_CHUNKS;
  const Seg sg = p.seg(tile, g / seg_groups);
  return seg_base(sg) + size_t(g % seg_groups) * repack_group_step(sg.N);
}

// Names the block's item after the current one for the feed: its stages
// can then stream behind the current item's (gemv_staged).
// (An item: `tile`'s chunks [kc0, kc1).)
template <class P>
KT_DEV void name_next(Ctx& c, const P& p, int tile, int kc0, int kc1) {
  const int sg = p.seg_chunks(tile) / STAGE_CHUNKS, g0 = kc0 / STAGE_CHUNKS, g1 = kc1 / STAGE_CHUNKS;
  c.next_n = g1 - g0;
  c.next_g0 = g0;
  c.next_seg_groups = sg;
  c.next_seg0 = g0 / sg;
  if (c.tid == 0)  // the only thread that issues
    for (int k = g0 / sg; k <= (g1 - 1) / sg; ++k) {
      const Seg seg = p.seg(tile, k);
      c.sm->next_base[k - g0 / sg] = seg_base(seg);
      c.sm->next_step[k - g0 / sg] = repack_group_step(seg.N);
    }
}
// Stages [q0, q1) of the named next item.
KT_DEV void feed_next_stages(Ctx& c, int q0, int q1) {
  if (c.tid != 0) return;
  for (int q = q0; q < q1; ++q) {
    const int grp = c.next_g0 + q;
    const int k = grp / c.next_seg_groups - c.next_seg0;
    feed_raw(c, c.sm->next_base[k] + size_t(grp % c.next_seg_groups) * c.sm->next_step[k]);
  }
}

// Stages [q0, q1) of the item whose groups start at g0 (a tile of phase p).
template <class P>
KT_DEV void feed_item_stages(Ctx& c, const P& p, int tile, int g0, int q0, int q1) {
  for (int q = q0; q < q1; ++q) feed_raw(c, stage_offset(p, tile, g0 + q));
}
#endif

template <class P>
KT_DEV void stage_prologue(Ctx& c, P& p, int tile, int g0, int g1) {
#if KT_FEED >= 1
  // The first item of a phase: the previous phase's stages were all
  // consumed and released, so every slot is free.
  const int n = imin(STAGES, g1 - g0);
  feed_item_stages(c, p, tile, g0, 0, n);
  c.pre = n;
#else
  const int seg_groups = p.seg_chunks(tile) / STAGE_CHUNKS;
  Stage* stages = reinterpret_cast<Stage*>(c.sm->pipe);
  for (int s = 0; s < STAGES - 1; ++s) {
    const int grp = g0 + s;
    if (grp < g1) issue_stage(c, stages[s % STAGES], p.seg(tile, grp / seg_groups), grp % seg_groups);
    kt_cp_async_commit();
  }
#endif
}

// One __syncthreads per stage: it tells every thread that stage s has
// landed (each thread waited for its own copies) and that every warp is done
// with stage s - 1, whose slot then takes stage s + STAGES - 1. Each lane
// reads its 16 columns' raw scales and zeros from the stage and expands
// them itself (no separate expansion pass and its two extra barriers).
#if KT_FEED >= 1
// This warp's Q chunks (from first_chunk) of a repacked stage whose first
// chunk is lc0 of the staged input: the lane reads its 16 columns' scales
// and (128 + zero)s, already the packed pairs dequant_col takes.
template <int Q = FEED_Q>
KT_DEV void compute_feed_stage(const Stage& st, int lane, int first_chunk, uint32_t bias, const uint32_t* xh,
                               const uint32_t* xl, int lc0, float (&mma_acc)[8][4]) {
  const int g = lane >> 2;
  const uint4* sv = reinterpret_cast<const uint4*>(st.sc + 16 * g);
  const uint4* zv = reinterpret_cast<const uint4*>(st.ze + 16 * g);
  const uint4 s_lo = sv[0], s_hi = sv[1], z_lo = zv[0], z_hi = zv[1];
  const uint32_t ss[8] = {s_lo.x, s_lo.y, s_lo.z, s_lo.w, s_hi.x, s_hi.y, s_hi.z, s_hi.w};
  const uint32_t zz[8] = {z_lo.x, z_lo.y, z_lo.z, z_lo.w, z_hi.x, z_hi.y, z_hi.z, z_hi.w};
#pragma unroll
  for (int q = 0; q < Q; ++q) {
    const int j = first_chunk + q;
    const uint8_t* w = st.w + j * 1024 + lane * 16;
    chunk_compute_frag(*reinterpret_cast<const uint4*>(w), *reinterpret_cast<const uint4*>(w + 512), ss, zz, bias, xh,
                       xl, lc0 + j, mma_acc);
  }
}
// KT_FEED > 0: no block barrier per stage. The warps form groups of FEED_WPG
// that take an item's stages in turn (two groups at 8 warps: two stages in
// progress, each warp FEED_Q chunks of its group's, so their chains
// interleave and the scales are read once per FEED_Q chunks; the engine's
// v11 measured 2 chunks a warp 12% faster than 1). A warp waits for the
// stage's full mbarrier, computes its chunks from the repacked fragments (the
// stage's scales and (128 + zero)s are already the packed pairs dequant_col
// takes) and releases the slot on its empty mbarrier. Feeds 1-3 (the loader's
// consumers run consume_stages).
template <class P>
KT_DEV void gemv_staged(Ctx& c, P& p, int tile, int g0, int g1, float (&acc)[16], float (&mma_acc)[8][4]) {
  (void)acc;
  // The block's stream: this item's n stages, then the next item's nn
  // (run_gemv_phase names it when it is known: a static schedule, weights
  // that do not wait for the routing). `issued` of them are in flight; at
  // stage s the ring is kept STAGES - 1 ahead, into slots that stages up to
  // s - 2 held (released by then, so thread 0 rarely waits).
  const int n = g1 - g0, nn = c.next_n;
  int issued = c.pre;
  auto issue_to = [&](int upto) {
    upto = imin(upto, n + nn);
    if (issued >= upto) return;
    if (issued < n) feed_item_stages(c, p, tile, g0, issued, imin(upto, n));
    if (upto > n) feed_next_stages(c, imax(issued, n) - n, upto - n);
    issued = upto;
  };
  issue_to(STAGES);
  const Stage* stages = reinterpret_cast<const Stage*>(c.sm->pipe);
  const int group = c.warp / FEED_WPG, first_chunk = (c.warp % FEED_WPG) * FEED_Q;
  const uint32_t bias = g_bias_pair;
  for (int s = 0; s < n; ++s) {
    if (s >= 1) issue_to(s + STAGES - 1);
    __syncwarp();  // warp 0 whole again (thread 0 may have waited for a slot) before its mma
    const unsigned slot = c.eaten % STAGES, parity = (c.eaten / STAGES) & 1;
    ++c.eaten;
    if (s % FEED_GROUPS != group) continue;
    kt_mbar_wait(&c.sm->full[slot], parity);
    compute_feed_stage(stages[slot], c.lane, first_chunk, bias, c.sm->xs_hi, c.sm->xs_lo, (g0 + s) * STAGE_CHUNKS,
                       mma_acc);
    __syncwarp();
    if (c.lane == 0) kt_mbar_arrive(&c.sm->empty[slot]);
  }
  c.pre = issued - n;  // the next item's, already in flight
  kt_block_sync();  // every warp has released this item's slots
}
#else
template <class P>
KT_DEV void gemv_staged(Ctx& c, P& p, int tile, int g0, int g1, float (&acc)[16], float (&mma_acc)[8][4]) {
  Stage* stages = reinterpret_cast<Stage*>(c.sm->pipe);
  const int seg_groups = p.seg_chunks(tile) / STAGE_CHUNKS;
  const int n = g1 - g0;
  // Started before the barrier that preceded this phase (KT_EARLY), or now.
  if (!c.early) stage_prologue(c, p, tile, g0, g1);
  c.early = false;
  const int lane = c.lane, g = lane >> 2, t = lane & 3, sw = (t & 3) << 1;
  const uint32_t bias = g_bias_pair;
  for (int s = 0; s < n; ++s) {
    kt_cp_async_wait<STAGES - 2>();
    kt_block_sync();
    if (s + STAGES - 1 < n) {
      const int grp = g0 + s + STAGES - 1;
      issue_stage(c, stages[(s + STAGES - 1) % STAGES], p.seg(tile, grp / seg_groups), grp % seg_groups);
    }
    kt_cp_async_commit();
    const Stage& st = stages[s % STAGES];
    const Seg sg = p.seg(tile, (g0 + s) / seg_groups);
    for (int j = c.warp; j < STAGE_CHUNKS; j += WARPS) {
      uint32_t ss[8], zz[8];
      expand_smem_scales(st.sc, st.ze, g, sg.n0 + 16 * g < sg.N, ss, zz);
      const uint8_t* w = st.w + j * 8 * TILE;
      const uint4 wa = *reinterpret_cast<const uint4*>(w + t * TILE + ((g ^ sw) * 16));
      const uint4 wb = *reinterpret_cast<const uint4*>(w + (t + 4) * TILE + ((g ^ sw) * 16));
      chunk_compute(wa, wb, ss, zz, bias, c.sm->xs_hi, c.sm->xs_lo, (g0 + s) * STAGE_CHUNKS + j, acc, mma_acc);
    }
  }
  kt_block_sync();  // the ring is free for the next item (or the attention tiles)
}
#endif

// After accumulation: lanes with t == 0 hold the warp's sums for columns
// n0 + 16g + b in out[b].
KT_DEV void gemv_finish(float (&acc)[16], float (&mma_acc)[8][4], float (&out)[16]) {
#if KT_DEQUANT == 1
  (void)acc;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    out[2 * j] = mma_acc[j][0] + mma_acc[j][1];
    out[2 * j + 1] = mma_acc[j][2] + mma_acc[j][3];
  }
#else
  (void)mma_acc;
#pragma unroll
  for (int b = 0; b < 16; ++b) {
    float v = acc[b];
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    out[b] = v;
  }
#endif
}

#if KT_FEED == 4
// KT_FEED 4: the consumers' loop over an item's n stages, which the loader
// warp streams into the ring (the block's stages eaten so far: `eaten`),
// leaving the warp's sums in red_row (lanes t == 0, columns 16 g ..).
// Warps take the stages in groups as gemv_staged's bulk feed does;
// eat_stages is the loop for eating warp `eater` (the consumers' warps 0 ..
// WARPS - 1, the light warps after them), of warp group eater / FEED_WPG.
KT_DEV void eat_stages(Smem* sm, unsigned eaten, int g0, int n, uint32_t bias, float* red_row, int eater) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
  const int group = eater / FEED_WPG, first_chunk = (eater % FEED_WPG) * FEED_Q;
  const Stage* stages = reinterpret_cast<const Stage*>(sm->pipe);
  float acc[16], mma_acc[8][4], out[16];
#pragma unroll
  for (int j = 0; j < 8; ++j) mma_acc[j][0] = mma_acc[j][1] = mma_acc[j][2] = mma_acc[j][3] = 0;
  for (int s = group; s < n; s += EAT_GROUPS) {
    const unsigned k = eaten + unsigned(s), slot = k % STAGES, parity = (k / STAGES) & 1;
    kt_mbar_wait(&sm->full[slot], parity);
    compute_feed_stage(stages[slot], lane, first_chunk, bias, sm->xs_hi, sm->xs_lo, (g0 + s) * STAGE_CHUNKS, mma_acc);
    __syncwarp();
    if (lane == 0) kt_mbar_arrive(&sm->empty[slot]);
  }
  gemv_finish(acc, mma_acc, out);
  if ((lane & 3) == 0) {
#pragma unroll
    for (int b = 0; b < 16; ++b) red_row[16 * g + b] = out[b];
  }
}
// The consumers' copy: one out-of-line copy for every GEMV phase (inlined,
// each phase type had its own and ncu found 14% of the warps' stall
// samples waiting for instructions: run 126).
__device__ __noinline__ void consume_stages(Smem* sm, unsigned eaten, int g0, int n, uint32_t bias, float* red_row) {
  eat_stages(sm, eaten, g0, n, bias, red_row, int(threadIdx.x >> 5));
}

#if KT_LIGHT_WARPS
// KT_LIGHT_WARPS 4: the light warpgroup (threads KT_THREADS + 128 ..) eats
// the last groups' stages of every GEMV item the consumers post, so 12
// warps eat an item's stages while only the consumers' 8 carry the rest of
// the step's code. 12 warps at 144 registers each spilled at every phase's
// start (RESULTS, run 324); these keep kLightRegs and run only this loop,
// inlined here (an out-of-line callee is not held to the caller's
// setmaxnreg count: run 246). Each item: wait on light_go, eat, leave each
// warp's sums in its red row after the consumers', arrive on light_done.
// Measured on the H100 (RESULTS, run 327): +4.4 to +6.2 us a step. The down
// phase's stages are eaten 0.6 us faster, but the consumers at 176
// registers spill at the phases' starts and hand-offs.
KT_DEV void light_main(Smem* sm) {
  const int lw = int(threadIdx.x >> 5) - WARPS - 4;  // 0 .. 3: its red row and eating warp are WARPS + lw
  for (unsigned k = 0;; ++k) {
    kt_mbar_wait(&sm->light_go, k & 1);
    const int n = sm->light_n;
    if (n < 0) return;
    eat_stages(sm, sm->light_eaten, sm->light_g0, n, g_bias_pair, sm->red[WARPS + lw], WARPS + lw);
    __syncwarp();
    if ((threadIdx.x & 31) == 0) kt_mbar_arrive(&sm->light_done);
  }
}
#endif
// The consumers' side: thread 0 posts an item (n stages from group g0; n <
// 0 ends the light warps), after the block barrier that made its staged
// input whole, so light_go's release carries it.
KT_DEV void post_light(Ctx& c, int g0, int n) {
#if KT_LIGHT_WARPS
  if (c.tid == 0) {
    c.sm->light_eaten = c.eaten;
    c.sm->light_g0 = g0;
    c.sm->light_n = n;
    kt_mbar_arrive(&c.sm->light_go);
  }
#else
  (void)c;
  (void)g0;
  (void)n;
#endif
}
// Before the consumers read the item's red rows: the light warps' are in.
KT_DEV void wait_light(Ctx& c) {
#if KT_LIGHT_WARPS
  if (c.tid < TILE) kt_mbar_wait(&c.sm->light_done, c.light_items & 1);
  ++c.light_items;
#else
  (void)c;
#endif
}
#endif

// A GEMV phase P provides: tiles(), seg_chunks(tile), seg(tile, s),
// stage(c, tile, kc0, kc1) (fill xs for that k range, or nothing when the
// input was staged once for the phase), epilogue(c, tile, y), and
// prefetchable (its weights do not depend on data of this launch).
// The k-split of a phase's tiles: the S that minimises the phase's
// makespan, in chunks per warp, within what the grid allows (the smallest
// such S on a tie). A tile's item costs kItemCostChunks + chunks / (S x
// warps): the fixed cost, ~7 chunks' worth, is what run 10 measured (an
// item takes ~4.5 us + 0.65 us per chunk per warp: first loads, scales,
// the partial sums' hand-off). Items go round-robin over the slots (blocks
// x KT_WAVES), the phase's `extra_items` (row items, lead tiles) first.
// KT_SPLIT_COST 0 counts every item at a tile item's cost: makespan =
// rounds x that. KT_SPLIT_COST 1 sums a slot's items, the extra ones at
// `extra_cost` each: the MoE's 120 small router and shared-expert items
// then no longer count as a round of routed items, which made S 2 where 1
// has no hand-off and a shorter makespan (RESULTS, run 58).
// The lanes of each warp try candidates in parallel: a serial loop over up
// to 72 candidates cost one thread 6-8 us at the start of a phase
// (RESULTS.md, run 10). Call with whole warps; every block gets the same
// answer.
constexpr float kItemCostChunks = 7.0f;
constexpr float kRowItemCostChunks = 4.0f;  // a row item: one bf16 row of D per warp, one round trip
KT_DEV float split_cost(int tiles, int s, float item_cost, int extra_items, float extra_cost, int slots) {
  const int total = tiles * s + extra_items;
#if KT_SPLIT_COST == 1
  // Slot b takes n_b = q + (b < r) items, e_b = qe + (b < re) of them extra:
  // three classes of slots, split at r and re.
  const int q = total / slots, r = total % slots, qe = extra_items / slots, re = extra_items % slots;
  const int firsts[3] = {0, r < re ? r : re, r < re ? re : r};
  float most = 0;
  for (int i = 0; i < 3; ++i) {
    const int b = firsts[i];
    if (b >= slots) continue;
    const int n = q + (b < r), e = qe + (b < re);
    const float load = float(e) * extra_cost + float(n - e) * item_cost;
    most = load > most ? load : most;
  }
  return most;
#else
  (void)extra_cost;
  return float((total + slots - 1) / slots) * item_cost;
#endif
}
KT_DEV int split_for(int tiles, int chunks, int extra_items, float extra_cost, int blocks) {
  // Staged items are whole groups; register items give each warp a chunk.
  const int most = KT_STAGES > 0 ? chunks / STAGE_CHUNKS : (chunks / WARPS > 0 ? chunks / WARPS : 1);
  const int slots = blocks * KT_WAVES;
  int best = 1;
  float best_cost = 1e30f;
  for (int s = (threadIdx.x & 31) + 1; s <= most && tiles * s <= kItemSlots; s += 32) {
    const float cost =
        split_cost(tiles, s, kItemCostChunks + float(chunks) / float(s * WARPS), extra_items, extra_cost, slots);
    if (cost < best_cost) {
      best_cost = cost;
      best = s;
    }
  }
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) {
    const float other_cost = __shfl_xor_sync(0xffffffffu, best_cost, m);
    const int other = __shfl_xor_sync(0xffffffffu, best, m);
    if (other_cost < best_cost || (other_cost == best_cost && other < best)) {
      best_cost = other_cost;
      best = other;
    }
  }
  return best;
}

// One item (numbered by ItemMap, below): k-split `split` of S of a tile, chunks
// [kc0, kc1) of its k range. A tile cut into S > 1 items is finished by
// whichever ends last (an atomic counter): it sums the items' partials
// (slots slot0 .. slot0 + S - 1) in split order and runs the epilogue.
struct Item {
  int tile, kc0, kc1, split, S, slot0;
  bool one_round;  // the phase has at most one item a block (gather_polled may wait)
};
// An item's k range: each warp's sums for the tile's 128 columns, left in
// c.sm->red[warp].
template <class P>
KT_DEV void item_sums(Ctx& c, P& p, int tile, int kc0, int kc1) {
  float acc[16], mma_acc[8][4], out[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) mma_acc[j][0] = mma_acc[j][1] = mma_acc[j][2] = mma_acc[j][3] = 0;
#if KT_FEED == 4
  (void)acc;
  (void)mma_acc;
  (void)out;
  p.stage(c, tile, kc0, kc1);
  post_light(c, kc0 / STAGE_CHUNKS, (kc1 - kc0) / STAGE_CHUNKS);
  consume_stages(c.sm, c.eaten, kc0 / STAGE_CHUNKS, (kc1 - kc0) / STAGE_CHUNKS, g_bias_pair, c.sm->red[c.warp]);
  c.eaten += unsigned((kc1 - kc0) / STAGE_CHUNKS);
  return;
#elif KT_STAGES > 0
  p.stage(c, tile, kc0, kc1);
  gemv_staged(c, p, tile, kc0 / STAGE_CHUNKS, kc1 / STAGE_CHUNKS, acc, mma_acc);
#elif KT_GEMV_CODE >= 1
  (void)out;
  for (int i = c.lane; i < TILE; i += 32) c.sm->red[c.warp][i] = 0;
  __syncwarp();
  gemv_registers(c, p, tile, kc0, kc1, acc, mma_acc);
  __syncwarp();
  return;
#else
  gemv_registers(c, p, tile, kc0, kc1, acc, mma_acc);
#endif
  gemv_finish(acc, mma_acc, out);
  const int g = c.lane >> 2, t = c.lane & 3;
  if (t == 0) {
#pragma unroll
    for (int b = 0; b < 16; ++b) c.sm->red[c.warp][16 * g + b] = out[b];
  }
}

// KT_GATHER 1: a partial sum not yet written holds kUnwritten (a NaN no
// arithmetic makes; the prepare kernel marks them all, and split 0 marks
// again those it has read).
constexpr unsigned kUnwritten = 0xffffffffu;

// KT_GATHER 1, one column of a k-split tile (thread c.tid < TILE): split 0
// adds the other splits' partials to its own sums y as they land, polling
// them at L2, instead of every split counting itself in by an atomic and
// the last one reading the partials after it: one L2 round trip less on
// the hand-off's path (RESULTS, run 208). Only when the phase has one item
// a block (item.one_round), so split 0 never waits for an item queued
// behind a waiting one. The sum's order is the counter's: split 0, 1, ...
// `part`: this column's partial of split 0 (its slot). KT_HELPERS 1: one
// out-of-line copy (KT_HELPER).
KT_HELPER float gather_polled_at(unsigned* part, int S, float y) {
  constexpr int kBatch = 8;  // loads in flight at once
  for (int sp0 = 1; sp0 < S; sp0 += kBatch) {
    unsigned w[kBatch];
    for (;;) {
      bool landed = true;
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (sp0 + j < S) w[j] = kt_ld_relaxed(part + size_t(sp0 + j) * TILE);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) landed = landed && (sp0 + j >= S || w[j] != kUnwritten);
      if (landed) break;
      __nanosleep(20);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (sp0 + j < S) {
        y += __uint_as_float(w[j]);
        kt_st_relaxed(part + size_t(sp0 + j) * TILE, kUnwritten);
      }
  }
  return y;
}
KT_DEV float gather_polled(Ctx& c, const Item& item, int slot0, float y) {
  return gather_polled_at(reinterpret_cast<unsigned*>(c.s->partials) + size_t(slot0) * TILE + c.tid, item.S, y);
}

// KT_FLOW 1 or 2: which half of the k-split partials and counters this GEMV
// phase uses (consecutive phases alternate; flow_tag says why).
KT_DEV int flow_half(const Ctx& c) { return KT_FLOW ? (c.gemv_phases - 1) & 1 : 0; }

template <class P>
KT_DEV void gemv_item(Ctx& c, P& p, const Item& item) {
  const int tile = item.tile, split = item.split, S = item.S;
  const int slot0 = item.slot0 + flow_half(c) * kItemSlots, count = tile + flow_half(c) * (kMaxTiles / 2);
  const bool first = c.items++ == 0;
  if (first) stamp(c, c.layer, kPhaseItem);
  item_sums(c, p, tile, item.kc0, item.kc1);
  if (first) stamp(c, c.layer, kPhaseItemComputed);
  p.after_sums(c, tile);
  // The epilogue's own loads (a residual, the conv windows) go out now: their
  // round trip overlaps the k-split hand-off instead of following it.
  const typename P::Operands ops = p.operands(c, tile);
  kt_block_sync();
#if KT_FEED == 4
  wait_light(c);
#endif
  float y = 0;
  if (c.tid < TILE)
    for (int w = 0; w < WARPS + kLightWarps; ++w) y += c.sm->red[w][c.tid];
  if (float* sums = p.tile_sums(c, tile)) {
    // KT_REDUCE 1, KT_MOE_REDUCE 1: the next phase's staging reads the sums
    // (stage_carried, DownPhase::stage); the grid barrier before it
    // publishes these atomics.
    for (int i = 0; i < 64 * KT_DOWN_LATE; ++i) __nanosleep(1000);
    if (c.tid < TILE) atomicAdd(sums + c.tid, y);
    kt_block_sync();  // every warp's row of red was read: the block's next item clears them
    // After the block barrier: thread 0's release covers every thread's atomics (cumulativity).
    if (unsigned* ready = p.sums_ready(c, tile)) publish(c, ready, unsigned(item.kc1 - item.kc0));
    if (first) stamp(c, c.layer, kPhaseItemDone);
    return;
  }
  if (KT_GATHER_POLL && S > 1 && item.one_round) {
    if (split > 0) {
      // The other splits' sums are split 0's to add (gather_polled).
      if (c.tid < TILE)
        kt_st_relaxed(reinterpret_cast<unsigned*>(c.s->partials) + size_t(slot0 + split) * TILE + c.tid,
                      __float_as_uint(y));
      kt_block_sync();  // every warp's row of red was read: the block's next item clears them
      if (first) stamp(c, c.layer, kPhaseItemDone);
      return;
    }
    if (c.tid < TILE) y = gather_polled(c, item, slot0, y);
  } else if (S > 1) {
    if (c.tid < TILE) c.s->partials[size_t(slot0 + split) * TILE + c.tid] = y;
    kt_block_sync();
    // One thread publishes the block's partials, after the block barrier
    // (cumulativity, as in a grid sync); a fence in every thread kept every
    // warp waiting on its own (ncu: membar). KT_HANDOFF 1: the counter's
    // atomic is itself acquire-release, KT_HANDOFF 0: fence, then atomic.
    if (c.tid == 0) {
#if KT_HANDOFF == 1
      c.sm->flag = kt_atom_add_acq_rel(&c.s->counters[count], 1) == S - 1;
#else
      __threadfence();
      c.sm->flag = atomicAdd(&c.s->counters[count], 1) == S - 1;
#endif
    }
    kt_block_sync();
    if (!c.sm->flag) {
      if (first) stamp(c, c.layer, kPhaseItemDone);
      return;
    }
#if KT_HANDOFF == 0
    __threadfence();
#endif
    y = 0;
    if (c.tid < TILE)
      for (int sp = 0; sp < S; ++sp) y += kt_ld_cg(&c.s->partials[size_t(slot0 + sp) * TILE + c.tid]);
    // KT_GATHER 1: a later phase may gather these slots by polling
    // (gather_polled), so they are marked unwritten again once read.
    if (KT_GATHER_POLL && c.tid < TILE)
      for (int sp = 0; sp < S; ++sp)
        kt_st_relaxed(reinterpret_cast<unsigned*>(c.s->partials) + size_t(slot0 + sp) * TILE + c.tid, kUnwritten);
    if (c.tid == 0) c.s->counters[count] = 0;
  }
  if (c.tid < TILE) c.sm->ytile[c.tid] = y;
  kt_block_sync();
  p.epilogue(c, tile, c.sm->ytile, ops);
  kt_block_sync();
  p.after_epilogue(c, tile);
  if (first) stamp(c, c.layer, kPhaseItemDone);
}

// How a GEMV phase's work is numbered: row items first (small, and others
// may wait for them), then the phase's lead tiles (KT_LEAD: tiles whose
// weights and input are ready when the phase starts, such as the shared
// expert's while the routed experts wait for the router) cut into as many
// k-splits as fill the first wave, then the other tiles x S k-splits (S
// from split_for).
constexpr int kSplitUnit = KT_STAGES > 0 ? STAGE_CHUNKS : 1;  // chunks per split unit: staged items are whole groups

// The numbering of a GEMV phase of this shape (its tiles, row items, chunks
// per tile and lead tiles). Whole warps call it (split_for). The search
// costs ~0.5-1.3 us (RESULTS, run 145), and every phase type that numbers
// itself inlines a ~4-KB copy of it (~70 KB of code in all, run 171).
struct PhaseShape {
  int tiles, rows, nch, lead;
};
template <class P>
KT_DEV PhaseShape shape_of(const P& p) {
  return {p.tiles(), p.row_items(), p.seg_chunks(0) * p.nseg(0), p.lead_tiles()};
}
// blocks: the step's grid (the prepare table's differs).
KT_DEV ItemPlan number_items(const PhaseShape& sh, int blocks = int(gridDim.x)) {
  ItemPlan pl;
  pl.rows = sh.rows;
  pl.nch = sh.nch;
  pl.lead = KT_LEAD ? sh.lead : 0;
  const int fill = pl.lead > 0 ? (blocks - sh.rows) / pl.lead : 1;
  pl.S_lead = fill < 1 ? 1 : fill > sh.nch / kSplitUnit ? sh.nch / kSplitUnit : fill;
  // The extra items' cost: a lead item's share of its tile, else a row item's.
  const float extra_cost =
      pl.lead > 0 ? kItemCostChunks + float(sh.nch) / float(pl.S_lead * WARPS) : kRowItemCostChunks;
  pl.S = split_for(sh.tiles - pl.lead, sh.nch, sh.rows + pl.lead * pl.S_lead, extra_cost, blocks);
  pl.items = sh.rows + pl.lead * pl.S_lead + (sh.tiles - pl.lead) * pl.S;
  return pl;
}
template <class P>
KT_DEV ItemPlan number_items(const P& p) {
  return number_items(shape_of(p));
}

// KT_NUMBERING 3: an item as the prepare table lists it (16 bytes: chunks
// and split counts fit 16 bits, slots 30).
KT_DEV uint4 pack_item(const Item& i) {
  return make_uint4(unsigned(i.tile), unsigned(i.kc0 | i.kc1 << 16), unsigned(i.split | i.S << 16),
                    unsigned(i.slot0) | (i.one_round ? 1u << 30 : 0u));
}
KT_DEV Item unpack_item(uint4 w) {
  return Item{int(w.x), int(w.y & 0xffff), int(w.y >> 16), int(w.z & 0xffff), int(w.z >> 16),
              int(w.w & 0x3fffffff), (w.w >> 30) != 0u};
}

struct ItemMap : ItemPlan {
  static constexpr int unit = kSplitUnit;
  // KT_NUMBERING 3: the kind's items, the block's first ones (shared
  // memory) and all of them (the prepare table's).
  const uint4* mine = nullptr;
  const uint4* all = nullptr;
  ItemMap() = default;
  KT_DEV explicit ItemMap(const ItemPlan& plan) : ItemPlan(plan) {}
  // Item `it` (rows <= it < items) for a grid of `blocks`, worked out.
  KT_DEV Item number(int it, int blocks) const {
    const int nu = nch / unit;
    int j = it - rows, tile, split, s, slot0;
    if (j < lead * S_lead) {
      tile = j / S_lead, split = j % S_lead, s = S_lead, slot0 = tile * S_lead;
    } else {
      j -= lead * S_lead;
      tile = lead + j / S, split = j % S, s = S, slot0 = lead * S_lead + (tile - lead) * S;
    }
    return Item{tile, split * nu / s * unit, (split + 1) * nu / s * unit, split, s, slot0, items <= blocks};
  }
  // Item `it`, the block's `nth` of the phase (-1: not known, KT_SCHED 1).
  KT_DEV Item item(int it, int nth) const {
#if KT_NUMBERING == 3
    return unpack_item(nth >= 0 && nth < kBlockItems ? mine[nth] : all[it]);
#else
    (void)nth;
    return number(it, int(gridDim.x));
#endif
  }
};

// The numbering of phase kind `kind` from the launch's start (KT_NUMBERING
// 1-3; 3 with its items).
KT_DEV ItemMap kind_map(const Ctx& c, int kind) {
#if KT_NUMBERING >= 1
  ItemMap map(c.sm->plans[kind]);
#if KT_NUMBERING == 3
  map.mine = c.sm->block_items[kind];
  map.all = c.s->item_table[kind];
#endif
  return map;
#else
  (void)c;
  (void)kind;
  return ItemMap();
#endif
}

// Phase p's numbering: KT_NUMBERING 0, the one barrier_before made for it,
// if it did; 1-3, its kind's in shared memory from the launch's start.
template <class P>
KT_DEV ItemMap phase_map(const Ctx& c, const P& p) {
#if KT_NUMBERING >= 1
  return kind_map(c, p.plan_kind());
#else
  return c.plan_phase == c.gemv_phases ? ItemMap(c.plan) : ItemMap(number_items(p));
#endif
}

// Prefetches into L2 the weight rows this block will read in phase p.
template <class P>
KT_DEV void prefetch_phase(Ctx& c, P& p) {
#if KT_PREFETCH
  const ItemMap map = phase_map(c, p);
  for (int it = int(blockIdx.x), nth = 0; it < map.items; it += gridDim.x, ++nth) {
    if (it < map.rows) continue;
    const Item item = map.item(it, nth);
    const int tile = item.tile, kc0 = item.kc0, kc1 = item.kc1;
    if (!p.static_weights(tile)) continue;
    const int segc = p.seg_chunks(tile);
    for (int kp = kc0 * 8 + c.tid; kp < kc1 * 8; kp += THREADS) {
      const int s = kp / (segc * 8), lp = kp % (segc * 8);
      const Seg sg = p.seg(tile, s);
      const uint8_t* row = sg.wq + size_t(lp) * sg.N + sg.n0;
      kt_prefetch_l2(row);
      kt_prefetch_l2(row + TILE - 1);
    }
  }
#else
  (void)c;
  (void)p;
#endif
}

// KT_EARLY: before waiting at the barrier that precedes phase p, start
// streaming the weights of this block's first item of p into shared memory
// (weights do not depend on what the barrier waits for).
template <class P>
KT_DEV void early_issue(Ctx& c, P& p) {
#if KT_STAGES > 0 && KT_EARLY
  if (KT_FEED == 4) return;  // the loader warp streams them
  const ItemMap map = phase_map(c, p);
  const int it = int(blockIdx.x);
  if (it < map.rows || it >= map.items) return;
  const Item item = map.item(it, 0);
  if (!p.static_weights(item.tile)) return;
#if KT_FEED >= 1
  if (c.pre > 0) return;  // the previous phase's last item streamed them already
#endif
  kt_block_sync();  // the shared-memory pipeline is free again
  stage_prologue(c, p, item.tile, item.kc0 / STAGE_CHUNKS, item.kc1 / STAGE_CHUNKS);
  c.early = KT_FEED == 0;  // the bulk feed counts them in c.pre
#else
  (void)c;
  (void)p;
#endif
}

// A phase's items (ItemMap). A block's first item is its index;
// the rest come round-robin (KT_SCHED 0) or from the phase's counter
// (KT_SCHED 1): blocks whose loads return sooner then take the items that
// would have queued behind slower ones. Thread 0 takes the next item when
// the current one starts, so the atomic's round trip hides behind it.
template <class P, class NP = P>
KT_DEV void run_gemv_phase(Ctx& c, P& p, const NP* np = nullptr) {
  (void)np;
  const ItemMap map = phase_map(c, p);
  if (float* sums = p.carry_sums()) c.carried = sums;
  unsigned* counter = &c.s->next_item[c.gemv_phases++];
#if KT_HOLD_ON
  signal_loader(c, &c.sm->gemv_started, unsigned(c.gemv_phases));
#endif
  // nth: the item's place among the block's (-1: not known, KT_SCHED 1).
  for (int it = blockIdx.x, nth = 0; it < map.items;) {
    int next = it + int(gridDim.x);
#if KT_SCHED == 1
    if (c.tid == 0) next = int(gridDim.x) + int(atomicAdd(counter, 1u));
#else
    (void)counter;
#endif
    if (it < map.rows) {
      p.row_item(c, it);
    } else {
      const Item item = map.item(it, nth);
      p.before_tile(c, item.tile);
#if KT_FEED >= 1
      // The bulk feed streams the block's next item behind this one when
      // it is known now (a static schedule; weights that do not wait for a
      // routing this block has not done): the phase's next, or after the
      // block's last, its first in the next GEMV phase np (when nothing
      // between them uses the ring).
      c.next_n = 0;
      if ((KT_FEED == 2 || KT_FEED == 3) && KT_SCHED == 0 && next >= map.rows && next < map.items) {
        const Item ni = map.item(next, nth + 1);
        if (p.feedable(c, ni.tile)) name_next(c, p, ni.tile, ni.kc0, ni.kc1);
      } else if (KT_FEED == 3 && KT_SCHED == 0 && next >= map.items && np) {
        const ItemMap nmap = phase_map(c, *np);
        const int first = int(blockIdx.x);
        if (first >= nmap.rows && first < nmap.items) {
          const Item ni = nmap.item(first, 0);
          if (np->feedable(c, ni.tile)) name_next(c, *np, ni.tile, ni.kc0, ni.kc1);
        }
      }
#endif
      gemv_item(c, p, item);
    }
#if KT_SCHED == 1
    if (c.tid == 0) c.sm->next_item = next;
    kt_block_sync();
    next = c.sm->next_item;
    kt_block_sync();  // read by all before thread 0 writes it again
    nth = -1;
#else
    ++nth;
#endif
    it = next;
  }
}

// A warp computes bf16(dot(xs, w_row)) for a bf16 weight row of length D.
// All of a lane's loads are issued before the first is used: the router's
// logits gate every routed expert, and a loop that waits for each load in
// turn made them several round trips late.
// KT_HELPERS 1: one out-of-line copy (KT_HELPER).
constexpr int kRowLoads = cdiv(D, 256);
KT_HELPER float row_dot_lane(const Smem* sm, int lane, const uint16_t* w) {
  uint4 v[kRowLoads];
#pragma unroll
  for (int j = 0; j < kRowLoads; ++j) {
    const int k = lane * 8 + 256 * j;
    v[j] = k < D ? kt_ld_weights<0>(w + k) : make_uint4(0, 0, 0, 0);
  }
  float acc = 0;
#pragma unroll
  for (int j = 0; j < kRowLoads; ++j) {
    const int k = lane * 8 + 256 * j;
    if (k >= D) break;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t xp = sm->xs_hi[k / 2 + i], wv = word_of(v[j], i);
      acc += kt_lo(xp) * kt_lo(wv) + kt_hi(xp) * kt_hi(wv);
    }
  }
  return kt_round_bf16(kt_warp_sum(acc));
}
KT_DEV float row_dot(Ctx& c, const uint16_t* w) { return row_dot_lane(c.sm, c.lane, w); }

// Shared between phases: a single-matrix tile list.
struct OneMatrix {
  KtW4 w;
  int N, K;
  size_t rp;  // KT_FEED > 0: its first repacked stage
  KT_DEV Seg seg_at(int tile) const { return make_seg(w.w_q, w.scales, w.zeros, N, tile * TILE, rp, K / G); }
};

KT_DEV double rope_angle(int pos, int i) { return double(pos) * pow(double(KT_ROPE_THETA), -2.0 * i / ROPE); }

KT_DEV void rope_pair(float y0, float y1, int pos, int i, uint16_t* out) {
  double s, co;
  sincos(rope_angle(pos, i), &s, &co);
  const double x0 = kt_round_bf16(y0), x1 = kt_round_bf16(y1);
  out[0] = kt_f2bf(float(x0 * co - x1 * s));
  out[1] = kt_f2bf(float(x1 * co + x0 * s));
}

// What a GEMV phase has unless it says otherwise: no row items, its input
// staged once for the phase, and weights known before the phase starts.
struct PhaseDefaults {
  size_t rp = 0;  // KT_FEED > 0: the layer's part of the repacked weights (attention or MoE) that seg() reads
  KT_DEV int row_items() const { return 0; }
  KT_DEV int lead_tiles() const { return 0; }
  KT_DEV void row_item(Ctx&, int) {}
  KT_DEV void stage(Ctx&, int, int, int) {}
  KT_DEV void before_tile(Ctx&, int) {}
  KT_DEV void after_epilogue(Ctx&, int) {}
  KT_DEV void after_sums(Ctx&, int) {}  // profile: warp 0 has the item's sums (every thread its warp's)
  // What a tile's epilogue loads besides the sums, loaded by the threads
  // that run it (c.tid < TILE) before the hand-off (gemv_item).
  struct Operands {};
  KT_DEV Operands operands(const Ctx&, int) const { return {}; }
  KT_DEV bool static_weights(int) const { return true; }
  // KT_FEED 2, 3: whether seg() can name tile's weights now (the routed
  // experts' only once this block has selected them).
  KT_DEV bool feedable(const Ctx&, int) const { return true; }
  KT_DEV float* carry_sums() const { return nullptr; }  // KT_REDUCE 1: where it leaves its sums for the next staging
  // Where a tile's items add their sums by atomics (no k-split hand-off; the
  // epilogue is then the next phase's), or nullptr.
  KT_DEV float* tile_sums(const Ctx&, int) const { return nullptr; }
  // With tile_sums: a counter that each item adds its k extent (chunks) to
  // once its sums are in, for readers that wait per tile instead of at a
  // grid barrier (KT_DOWN_START 1), or nullptr.
  KT_DEV unsigned* sums_ready(const Ctx&, int) const { return nullptr; }
};

// ---- K layer ------------------------------------------------------------------
struct QkvgPhase : PhaseDefaults {
  const KtKdaLayer& L;
  int layer;
  KT_DEV int plan_kind() const { return kPlanQkvg; }
  KT_DEV int tiles() const { return 4 * (C / TILE); }
  KT_DEV int nseg(int) const { return 1; }
  KT_DEV int seg_chunks(int) const { return D / CHUNK; }
  KT_DEV Seg seg(int tile, int) const {
    const int m = tile / (C / TILE);
    const KtW4& w = m == 0 ? L.q : m == 1 ? L.k : m == 2 ? L.v : L.g;
    return make_seg(w.w_q, w.scales, w.zeros, C, (tile % (C / TILE)) * TILE, rp + m * repack_bytes(D, C), D / G);
  }
  KT_DEV int row_items() const { return (KH + WARPS - 1) / WARPS; }
  KT_DEV void row_item(Ctx& c, int item) {
    const int h = item * WARPS + c.warp;
    if (h < KH) {
      float v = row_dot(c, L.beta + size_t(h) * D);
      if (c.lane == 0) c.s->beta_raw[h] = kt_f2bf(v);
    }
#if KT_KDA_START == 1
    kt_block_sync();
    for (int hh = item * WARPS; hh < imin(KH, (item + 1) * WARPS); ++hh) publish(c, &c.s->head_ready[layer][hh], 1u);
#endif
  }
  // KT_KDA_START 1: tile t of q, k, v or g is head t % KH's (TILE == KD).
  KT_DEV void after_epilogue(Ctx& c, int tile) {
#if KT_KDA_START == 1
    publish(c, &c.s->head_ready[layer][tile % (C / TILE)], 1u);
#else
    (void)c;
    (void)tile;
#endif
  }
  // q, k, v's column n: its conv window (the last 3 raw rows) and conv weights.
  struct Operands {
    uint16_t w0, w1, w2, cw[4];  // conv_w by halves: the tensor may be only 2-byte aligned
  };
  KT_DEV Operands operands(const Ctx& c, int tile) const {
    const int m = tile / (C / TILE), n = (tile % (C / TILE)) * TILE + c.tid;
    if (c.tid >= TILE || m == 3) return {};
    const uint16_t* win = L.win[m];
    const uint16_t* cw = L.conv_w + (size_t(m) * C + n) * 4;
    return {win[n], win[C + n], win[2 * C + n], {cw[0], cw[1], cw[2], cw[3]}};
  }
  KT_DEV void epilogue(Ctx& c, int tile, const float* y, const Operands& o) {
    const int m = tile / (C / TILE), n0 = (tile % (C / TILE)) * TILE;
    if (c.tid >= TILE) return;
    const int n = n0 + c.tid;
    const uint16_t raw = kt_f2bf(y[c.tid]);
    if (m == 3) {
      c.s->graw[n] = raw;
      return;
    }
    uint16_t* win = L.win[m];
    float s = kt_bf2f(o.w0) * kt_bf2f(o.cw[0]) + kt_bf2f(o.w1) * kt_bf2f(o.cw[1]) + kt_bf2f(o.w2) * kt_bf2f(o.cw[2]) +
              kt_bf2f(raw) * kt_bf2f(o.cw[3]);
    c.s->act[m][n] = kt_f2bf(kt_silu(s));
    win[n] = o.w1;
    win[C + n] = o.w2;
    win[2 * C + n] = raw;
  }
};

// Whether this warp's key row r exists (a constant when the warps divide KD).
KT_DEV bool kda_row(const Ctx& c, int r) { return KD % WARPS == 0 || c.warp * ((KD + WARPS - 1) / WARPS) + r < KD; }

// One KDA item: head h, value columns [32 jc, 32 jc + 32). Its rows of the
// state S (this thread's column, its warp's key rows) do not depend on this
// step and only the item touches them, so they load first: the block's first
// item's before the grid barrier that precedes the phase (kda_load; their
// DRAM round trip overlaps the barrier), and with KT_KDA_START 1 while the
// item waits for its head's inputs (q, k, v, g: four tiles of the q,k,v,g
// phase, and beta).
constexpr int KDA_RPW = (KD + WARPS - 1) / WARPS;  // key rows per warp (the last warp's may run past KD)
struct KdaState {
  float sv[KDA_RPW];
};
KT_DEV int kda_items() { return KH * (KD / 32); }
KT_DEV KdaState kda_load(const Ctx& c, const KtKdaLayer& L, int it) {
  const int h = it / (KD / 32), j = (it % (KD / 32)) * 32 + c.lane;
  const float* S = L.S + size_t(h) * KD * KD;
  KdaState st;
#pragma unroll
  for (int r = 0; r < KDA_RPW; ++r) st.sv[r] = kda_row(c, r) ? S[size_t(c.warp * KDA_RPW + r) * KD + j] : 0.0f;
  return st;
}

// The KDA update; `first` holds the block's first item's state rows.
KT_DEV void kda_phase(Ctx& c, const KtKdaLayer& L, int layer, const KdaState& first) {
  constexpr int RPW = KDA_RPW;
  for (int it = blockIdx.x; it < kda_items(); it += gridDim.x) {
    const int h = it / (KD / 32), j = (it % (KD / 32)) * 32 + c.lane;
    float* S = L.S + size_t(h) * KD * KD;
    float sv[RPW];
    const KdaState st = it == int(blockIdx.x) ? first : kda_load(c, L, it);
#pragma unroll
    for (int r = 0; r < RPW; ++r) sv[r] = st.sv[r];
#if KT_KDA_START == 1
    wait_for(c, &c.s->head_ready[layer][h], 5u);  // q, k, v, g and beta
#else
    (void)layer;
#endif
    // Every load of this step's inputs goes out before the first block
    // barrier: one round trip (v and beta had waited for it, a second).
    const uint16_t v_raw = kt_ld_cg(&c.s->act[2][h * KD + j]), beta_raw = kt_ld_cg(&c.s->beta_raw[h]);
    if (c.tid < KD) {
      const int i = c.tid;
      c.sm->kq[i] = kt_bf2f(kt_ld_cg(&c.s->act[1][h * KD + i]));
      c.sm->qq[i] = kt_bf2f(kt_ld_cg(&c.s->act[0][h * KD + i])) * 0.08838834764831845f;  // 128^-0.5
      c.sm->dec[i] = expf(-kt_softplus(kt_bf2f(kt_ld_cg(&c.s->graw[h * KD + i]))));
    }
    kt_block_sync();
    const float beta = kt_sigmoid(kt_bf2f(beta_raw));
    float pred = 0;
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const int i = c.warp * RPW + r;
      if (!kda_row(c, r)) continue;
      sv[r] *= c.sm->dec[i];
      pred += sv[r] * c.sm->kq[i];
    }
    c.sm->part[0][c.warp][c.lane] = pred;
    kt_block_sync();
    pred = 0;
    for (int w = 0; w < WARPS; ++w) pred += c.sm->part[0][w][c.lane];
    const float delta = beta * (kt_bf2f(v_raw) - pred);
    float o = 0;
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const int i = c.warp * RPW + r;
      if (!kda_row(c, r)) continue;
      sv[r] += c.sm->kq[i] * delta;
      S[size_t(i) * KD + j] = sv[r];
      o += sv[r] * c.sm->qq[i];
    }
    c.sm->part[1][c.warp][c.lane] = o;
    kt_block_sync();
    if (c.warp == 0) {
      float ot = 0;
      for (int w = 0; w < WARPS; ++w) ot += c.sm->part[1][w][c.lane];
#if KT_FLOW
      flow_put(c, &c.s->flow_o[h * KD + j], kt_f2bf(ot));
#else
      c.s->kda_o[h * KD + j] = kt_f2bf(ot);
#endif
    }
    kt_block_sync();
  }
}

// o_proj's and down's epilogue: out = res + bf16(y) for the tile's columns,
// the residual loaded before the hand-off (gemv_item).
struct Residual {
  uint16_t v;
};
KT_DEV Residual residual_of(const Ctx& c, const uint16_t* res, int tile) {
  return {c.tid < TILE ? kt_ld_cg(res + tile * TILE + c.tid) : uint16_t(0)};
}
// With KT_FLOW 1 and `tagged`, also as tagged words for the next phase (flow_tag).
KT_DEV void add_residual(const Ctx& c, uint16_t* out, int tile, const float* y, Residual r,
                         unsigned* tagged = nullptr) {
  if (c.tid >= TILE) return;
  const uint16_t v = kt_f2bf(kt_bf2f(r.v) + kt_round_bf16(y[c.tid]));
  out[tile * TILE + c.tid] = v;
#if KT_FLOW
  if (tagged) flow_put(c, tagged + tile * TILE + c.tid, v);
#else
  (void)tagged;
#endif
}

// o_proj: input staged once (bf16 [K]), output h = x + bf16(y).
struct OprojPhase : PhaseDefaults {
  OneMatrix m;
  const uint16_t* x;
  uint16_t* out;
  float* sums;  // KT_REDUCE 1: where the items add their sums (zero at launch start)
  unsigned* tagged = nullptr;  // KT_FLOW 1: h as tagged words too, for the MoE's staging
  KT_DEV int plan_kind() const { return m.K == C ? kPlanOprojK : kPlanOprojM; }
  KT_DEV int tiles() const { return D / TILE; }
  KT_DEV int nseg(int) const { return 1; }
  KT_DEV int seg_chunks(int) const { return m.K / CHUNK; }
  KT_DEV Seg seg(int tile, int) const { return m.seg_at(tile); }
  KT_DEV float* carry_sums() const { return KT_REDUCE == 1 ? sums : nullptr; }
  KT_DEV float* tile_sums(const Ctx&, int tile) const { return KT_REDUCE == 1 && sums ? sums + tile * TILE : nullptr; }
  using Operands = Residual;
  KT_DEV Operands operands(const Ctx& c, int tile) const { return residual_of(c, x, tile); }
  KT_DEV void epilogue(Ctx& c, int tile, const float* y, Operands r) { add_residual(c, out, tile, y, r, tagged); }
};

// ---- M layer ------------------------------------------------------------------
struct Mla1Phase : PhaseDefaults {
  const KtMlaLayer& L;
  int pos;
  static constexpr int QT = QDIM / TILE, KT = (KVA + TILE - 1) / TILE;
  KT_DEV int plan_kind() const { return kPlanMla1; }
  KT_DEV int tiles() const { return QT + KT; }
  KT_DEV int nseg(int) const { return 1; }
  KT_DEV int seg_chunks(int) const { return D / CHUNK; }
  KT_DEV Seg seg(int tile, int) const {
    if (tile < QT) return make_seg(L.q.w_q, L.q.scales, L.q.zeros, QDIM, tile * TILE, rp + kMlaQ, D / G);
    return make_seg(L.kv_a.w_q, L.kv_a.scales, L.kv_a.zeros, KVA, (tile - QT) * TILE, rp + kMlaKva, D / G);
  }
  KT_DEV void epilogue(Ctx& c, int tile, const float* y, Operands) {
    if (c.tid >= TILE) return;
    const int cidx = c.tid;
    if (tile < QT) {
      const int n = tile * TILE + cidx, hc = n % QH;
      if (hc < NOPE) {
        c.s->mla_q[n] = kt_f2bf(y[cidx]);
      } else if ((hc - NOPE) % 2 == 0) {
        rope_pair(y[cidx], y[cidx + 1], pos, (hc - NOPE) / 2, &c.s->mla_q[n]);
      }
    } else {
      const int n = (tile - QT) * TILE + cidx;
      if (n < R) {
        L.c_kv[size_t(pos) * R + n] = kt_f2bf(y[cidx]);
      } else if (n < KVA && (n - R) % 2 == 0) {
        rope_pair(y[cidx], y[cidx + 1], pos, (n - R) / 2, &L.k_rope[size_t(pos) * ROPE + (n - R)]);
      }
    }
  }
};

// q_abs[h][r] = sum_d W_kvb[r, h*(NOPE+VH) + d] q_nope[h][d], pre-scaled by
// 192^-0.5. Item: (head, 128 latent rows = 64 packed rows); 8 lanes take a
// packed row, 16 columns per lane, QA_TRIPS packed rows each, all their
// loads issued before the first is used. With 64 latent rows per item the
// phase was two rounds of items on 132 blocks, two dependent DRAM round
// trips (RESULTS, runs 68-69).
constexpr int QA_PAIRS = 64, QA_TRIPS = cdiv(QA_PAIRS, WARPS * 4);  // packed rows per item; per 8 lanes
// One q_abs item's weights and scales in registers. They are static, so the
// block's first item loads them before the grid barrier that precedes the
// phase (qabs_load): its DRAM round trip then overlaps the barrier, and only
// the queries' L2 round trip follows it.
struct QabsLoads {
  uint4 wv[QA_TRIPS];
  RawScales rs;
};
KT_DEV int qabs_items() { return MH * (R / 2 / QA_PAIRS); }
KT_DEV QabsLoads qabs_load(Ctx& c, const KtMlaLayer& L, int it) {
  const int per_head = R / 2 / QA_PAIRS, h = it / per_head, rp0 = (it % per_head) * QA_PAIRS;
  const int sub = c.lane >> 3, col = h * (NOPE + VH) + (c.lane & 7) * 16;
  QabsLoads ld;
#pragma unroll
  for (int i = 0; i < QA_TRIPS; ++i) {
    const int rp = rp0 + c.warp * 4 + sub + i * WARPS * 4;
    if (rp < rp0 + QA_PAIRS) ld.wv[i] = kt_ld_weights<KT_LOAD_HINT>(L.kv_b.w_q + size_t(rp) * KVB + col);
  }
  const Seg sg{L.kv_b.w_q, L.kv_b.scales, L.kv_b.zeros, KVB, 0};
  ld.rs = fetch_scales(sg, 2 * rp0 / G, col, true);  // one group: G == 2 QA_PAIRS
  return ld;
}

// The q_abs phase; `first` holds the block's first item's loads.
// after_loads() runs once, when the block's first item has issued its
// last loads (KT_ATTN_EARLY: the attention's first tiles go out behind them).
template <class AfterLoads>
KT_DEV void qabs_phase(Ctx& c, const KtMlaLayer& L, const QabsLoads& first, AfterLoads after_loads) {
  static_assert((R / 2) % QA_PAIRS == 0 && G == 2 * QA_PAIRS, "q_abs items: one quantization group each");
  const int per_head = R / 2 / QA_PAIRS;
  const int sub = c.lane >> 3, c16 = (c.lane & 7) * 16;
  for (int it = blockIdx.x; it < qabs_items(); it += gridDim.x) {
    const int h = it / per_head, rp0 = (it % per_head) * QA_PAIRS;
    const QabsLoads ld = it == int(blockIdx.x) ? first : qabs_load(c, L, it);
    uint32_t ss[8], zz[8];
    float q[16];
#pragma unroll
    for (int b = 0; b < 16; ++b) q[b] = kt_bf2f(kt_ld_cg(&c.s->mla_q[h * QH + c16 + b]));
    if (it == int(blockIdx.x)) after_loads();
#pragma unroll
    for (int i = 0; i < QA_TRIPS; ++i) {
      const int rp = rp0 + c.warp * 4 + sub + i * WARPS * 4;
      if (rp >= rp0 + QA_PAIRS) break;  // whole warps (64 is a multiple of 4)
      if (i == 0) expand_scales(ld.rs, true, ss, zz);
      float a0 = 0, a1 = 0;
#pragma unroll
      for (int b = 0; b < 16; ++b) {
        const uint32_t w = word_of(ld.wv[i], b >> 2);
        const uint32_t pr = dequant_col(kt_nibble_pair(w, w >> 4, b & 3), ss, zz, b);
        a0 += q[b] * kt_lo(pr);
        a1 += q[b] * kt_hi(pr);
      }
#pragma unroll
      for (int m = 1; m < 8; m <<= 1) {
        a0 += __shfl_xor_sync(0xffffffffu, a0, m);
        a1 += __shfl_xor_sync(0xffffffffu, a1, m);
      }
      if ((c.lane & 7) == 0) {
        c.s->q_abs[h * R + 2 * rp] = a0 * kQkScale;
        c.s->q_abs[h * R + 2 * rp + 1] = a1 * kQkScale;
      }
    }
  }
  if (int(blockIdx.x) >= qabs_items()) after_loads();  // a block with no item
}

KT_DEV int attn_chunks(int rows) {
  int n = int(gridDim.x) / (MH / HG);
  int most = (rows + 3) / 4;
  n = n > most ? most : n;
  n = n > kMaxChunks ? kMaxChunks : n;
  return n < 1 ? 1 : n;
}

// Attention partials (v2): an item is (head group, chunk of cached rows).
// The block streams the chunk through shared memory in tiles of ATT_ROWS
// rows (cp.async, ATT_STAGES deep, so the next tiles load while this one is
// used); each warp keeps an online softmax for its heads and takes rows four
// at a time, so the four dot products' warp reductions overlap.
// Lane dims: PIECE consecutive latent dims per piece, pieces 32 * PIECE
// apart (each warp-wide load is contiguous), plus 2 rope dims.
constexpr int LPL = R / 32;
constexpr int PIECE = LPL < 8 ? LPL : 8, PIECES = LPL / PIECE;
constexpr int HPW = (HG + WARPS - 1) / WARPS;  // heads per warp
static_assert(HPW <= 4 || KT_ATTN == 1, "at most 4 heads per warp in an attention item");

KT_DEV int lane_dim(int lane, int d) { return (d / PIECE) * 32 * PIECE + lane * PIECE + d % PIECE; }

// The cache rows of an attention item, read once per item (re-read from
// the kernel parameters for every copy, they cost issue slots; run 56).
struct AttSrc {
  const uint16_t* c_kv;    // the layer's latent cache, row 0
  const uint16_t* k_rope;  // its rope keys, row 0
};

// Rows [t0, t0 + rows) of the cache into `tile` (rows past them zeroed) by
// NT threads, this one number `tid` of them.
template <int NT, class Tile>  // AttTile, or AttMmaTile (rows padded)
KT_DEV void issue_att_rows(Tile& tile, const AttSrc& src, int t0, int rows, unsigned tid) {
  // A thread copies the same 16-byte piece of every RP-th latent row: its
  // piece, first row and both addresses are fixed per thread, so each copy
  // is an add and a compare. Written with signed indices and a loop
  // bounded by the thread index, the copies cost ~22 instructions each, a
  // third of the attention's issue slots per tile (ncu, RESULTS run 70).
  constexpr unsigned CP = R / 8, KP = ROPE / 8;  // 16-byte pieces per row
  constexpr unsigned TILE_ROWS = sizeof(tile.c) / sizeof(tile.c[0]);
  constexpr unsigned CS = sizeof(tile.c[0]) / 2, KS = sizeof(tile.k[0]) / 2;  // row strides, padding included
  constexpr unsigned RP = NT / CP, PASSES = (TILE_ROWS + RP - 1) / RP;  // latent rows per pass of the NT threads
  static_assert(NT % CP == 0, "whole latent rows per pass");
  const unsigned q = tid % CP, r0 = tid / CP;
  const uint16_t* from = src.c_kv + (size_t(t0) + r0) * R + q * 8;
  uint16_t* to = &tile.c[0][0] + r0 * CS + q * 8;
#pragma unroll
  for (unsigned k = 0; k < PASSES; ++k) {
    if (PASSES * RP > TILE_ROWS && r0 + k * RP >= TILE_ROWS) break;  // more threads than pieces
    const bool valid = int(r0 + k * RP) < rows;
    kt_cp_async16<KT_CACHE_HINT>(to + k * RP * CS, valid ? from + k * RP * R : src.c_kv, valid);
  }
#pragma unroll
  for (unsigned i = tid; i < TILE_ROWS * KP; i += NT) {
    const unsigned r = i / KP, p = i % KP;
    const bool valid = int(r) < rows;
    kt_cp_async16<Tile::kRopeHint>(&tile.k[0][0] + r * KS + p * 8,
                                 valid ? src.k_rope + (size_t(t0) + r) * ROPE + p * 8 : src.c_kv, valid);
  }
}
template <class Tile>
KT_DEV void issue_att_tile(Ctx& c, Tile& tile, const AttSrc& src, int t0, int rows) {
  issue_att_rows<THREADS>(tile, src, t0, rows, unsigned(c.tid));
}

KT_DEV void row_values(const AttTile& tile, int r, int lane, float (&cv)[LPL]) {
#pragma unroll
  for (int p = 0; p < PIECES; ++p) {
    const uint16_t* src = &tile.c[r][p * 32 * PIECE + lane * PIECE];
#pragma unroll
    for (int e = 0; e < PIECE; e += 2) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(src + e);
      cv[p * PIECE + e] = kt_lo(w);
      cv[p * PIECE + e + 1] = kt_hi(w);
    }
  }
}

KT_DEV void attn_phase(Ctx& c, const KtMlaLayer& L, int pos) {
  const int rows = pos + 1, nch = attn_chunks(rows), groups = MH / HG;
  const int items = groups * nch;
  AttTile* tiles = reinterpret_cast<AttTile*>(c.sm->pipe);
  const AttSrc src{L.c_kv, L.k_rope};
  for (int it = blockIdx.x; it < items; it += gridDim.x) {
    const int hg = it / nch, ch = it % nch;
    const int r0 = int(size_t(ch) * rows / nch), r1 = int(size_t(ch + 1) * rows / nch);
    const int ntiles = (r1 - r0 + ATT_ROWS - 1) / ATT_ROWS;
    // This warp's heads: hg * HG + warp + WARPS * i.
    float qa[HPW][LPL], acc[HPW][LPL], qr[HPW][2], m[HPW], l[HPW];
#pragma unroll
    for (int i = 0; i < HPW; ++i) {
      const int h = hg * HG + c.warp + WARPS * i;
      m[i] = -INFINITY;
      l[i] = 0;
#pragma unroll
      for (int d = 0; d < LPL; ++d) {
        qa[i][d] = c.warp + WARPS * i < HG ? kt_ld_cg(&c.s->q_abs[h * R + lane_dim(c.lane, d)]) : 0.0f;
        acc[i][d] = 0;
      }
      for (int e = 0; e < 2; ++e)
        qr[i][e] = c.warp + WARPS * i < HG ? kt_bf2f(kt_ld_cg(&c.s->mla_q[h * QH + NOPE + 2 * c.lane + e])) * kQkScale
                                           : 0.0f;
    }
    for (int s = 0; s < ATT_STAGES - 1; ++s) {
      if (s < ntiles) issue_att_tile(c, tiles[s % ATT_STAGES], src, r0 + s * ATT_ROWS, imin(ATT_ROWS, r1 - r0 - s * ATT_ROWS));
      kt_cp_async_commit();
    }
    for (int s = 0; s < ntiles; ++s) {
      const int sn = s + ATT_STAGES - 1;
      if (sn < ntiles) issue_att_tile(c, tiles[sn % ATT_STAGES], src, r0 + sn * ATT_ROWS, imin(ATT_ROWS, r1 - r0 - sn * ATT_ROWS));
      kt_cp_async_commit();
      kt_cp_async_wait<ATT_STAGES - 1>();
      kt_block_sync();
      const AttTile& tile = tiles[s % ATT_STAGES];
      const int rows_here = imin(ATT_ROWS, r1 - r0 - s * ATT_ROWS);
#pragma unroll
      for (int i = 0; i < HPW; ++i) {
        if (c.warp + WARPS * i >= HG) break;
        for (int rr = 0; rr < rows_here; rr += 4) {
          float sc[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int r = rr + q < rows_here ? rr + q : rows_here - 1;
            float cv[LPL];
            row_values(tile, r, c.lane, cv);
            const uint32_t kw = *reinterpret_cast<const uint32_t*>(&tile.k[r][2 * c.lane]);
            float v = qr[i][0] * kt_lo(kw) + qr[i][1] * kt_hi(kw);
#pragma unroll
            for (int d = 0; d < LPL; ++d) v += qa[i][d] * cv[d];
            sc[q] = v;
          }
#pragma unroll
          for (int mask = 16; mask >= 1; mask >>= 1)
#pragma unroll
            for (int q = 0; q < 4; ++q) sc[q] += __shfl_xor_sync(0xffffffffu, sc[q], mask);
          float mn = m[i];
#pragma unroll
          for (int q = 0; q < 4; ++q)
            if (rr + q < rows_here) mn = fmaxf(mn, sc[q]);
          const float corr = expf(m[i] - mn);
          l[i] *= corr;
#pragma unroll
          for (int d = 0; d < LPL; ++d) acc[i][d] *= corr;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (rr + q >= rows_here) break;
            const float p = expf(sc[q] - mn);
            float cv[LPL];
            row_values(tile, rr + q, c.lane, cv);
            l[i] += p;
#pragma unroll
            for (int d = 0; d < LPL; ++d) acc[i][d] += p * cv[d];
          }
          m[i] = mn;
        }
      }
      kt_block_sync();
    }
#pragma unroll
    for (int i = 0; i < HPW; ++i) {
      if (c.warp + WARPS * i >= HG) break;
      const int h = hg * HG + c.warp + WARPS * i, slot = ch * MH + h;
      if (c.lane == 0) {
        c.s->attn_m[slot] = m[i];
        c.s->attn_l[slot] = l[i];
      }
#pragma unroll
      for (int d = 0; d < LPL; ++d) c.s->attn_acc[size_t(slot) * R + lane_dim(c.lane, d)] = acc[i][d];
    }
  }
}

#include "kernels/kimi/cuda/attention_mma.cuh"

// o[h] = W_UV[h]^T o_lat[h]: one tile per head; the input (the combined
// attention partials for the item's latent rows) is staged per item.
struct WuvPhase : PhaseDefaults {
  const KtMlaLayer& L;
  int nch;
  KT_DEV int plan_kind() const { return kPlanWuv; }
  KT_DEV int tiles() const { return MH; }
  KT_DEV int nseg(int) const { return 1; }
  KT_DEV int seg_chunks(int) const { return R / CHUNK; }
  KT_DEV Seg seg(int h, int) const {
    return make_seg(L.kv_b.w_q, L.kv_b.scales, L.kv_b.zeros, KVB, h * (NOPE + VH) + NOPE, rp + kMlaKvb, R / G);
  }
  // The combined o_lat[h] for the item's dims: sum over chunks of
  // exp(m_c - M) acc_c / sum exp(m_c - M) l_c. SUB threads share 4 dims
  // and split the chunks. Each thread loads its chunk's m and l first (the
  // block's max and sum over them come first), then issues its chunks'
  // partial sums (16-byte loads, up to kWuvLoads), all before the first is
  // used, so the stage pays about one L2 round trip, not one per step
  // (RESULTS, runs 68-69: the stage had been ~6 us of the phase's 11). With
  // the partials issued first, m and l queued behind ~48 KB of them (run 156).
  static constexpr int kWuvLoads = 12;
  KT_DEV void stage(Ctx& c, int h, int kc0, int kc1) {
    float m = -INFINITY, l = 0;  // this thread's chunk's, for weigh_chunks
    if (c.tid < nch) {
      m = kt_ld_cg(&c.s->attn_m[c.tid * MH + h]);
      l = kt_ld_cg(&c.s->attn_l[c.tid * MH + h]);
    }
    const int quads = (kc1 - kc0) * (CHUNK / 4);
    int sub = 1;
    while (sub < 32 && quads * sub * 2 <= THREADS) sub *= 2;
    const int part = c.lane % sub, trips = (quads * sub + THREADS - 1) / THREADS;  // part: THREADS % sub == 0
    for (int trip = 0; trip < trips; ++trip) {  // block-uniform (barriers inside), so warp-uniform (shuffles)
      const int qd = (trip * THREADS + c.tid) / sub, d0 = kc0 * CHUNK + 4 * qd;
      const bool valid = qd < quads;
      float4 raw[kWuvLoads];
#pragma unroll
      for (int i = 0; i < kWuvLoads; ++i) {
        const int ch = part + i * sub;
        raw[i] = valid && ch < nch
                     ? kt_ld_cg(reinterpret_cast<const float4*>(&c.s->attn_acc[size_t(ch * MH + h) * R + d0]))
                     : float4{0, 0, 0, 0};
      }
      if (trip == 0) {
        weigh_chunks(c, h, m, l);  // while the loads are out
        if (c.items == 1) stamp(c, c.layer, kPointChunksWeighed, true);
      }
      float4 v = {0, 0, 0, 0};
#pragma unroll
      for (int i = 0; i < kWuvLoads; ++i) {
        const float w = part + i * sub < nch ? c.sm->cw[part + i * sub] : 0.0f;
        v.x += w * raw[i].x, v.y += w * raw[i].y, v.z += w * raw[i].z, v.w += w * raw[i].w;
      }
      for (int ch = part + kWuvLoads * sub; valid && ch < nch; ch += sub) {  // more chunks than loads
        const float4 a = kt_ld_cg(reinterpret_cast<const float4*>(&c.s->attn_acc[size_t(ch * MH + h) * R + d0]));
        const float w = c.sm->cw[ch];
        v.x += w * a.x, v.y += w * a.y, v.z += w * a.z, v.w += w * a.w;
      }
      for (int m = sub / 2; m >= 1; m >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, m);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, m);
        v.z += __shfl_xor_sync(0xffffffffu, v.z, m);
        v.w += __shfl_xor_sync(0xffffffffu, v.w, m);
      }
      const float den = c.sm->wden;
      if (valid && part == 0) {
        stage_f32_pair(c, d0 / 2, v.x / den, v.y / den);
        stage_f32_pair(c, d0 / 2 + 1, v.z / den, v.w / den);
      }
    }
    kt_block_sync();
    if (c.items == 1) stamp(c, c.layer, kPointItemStaged, true);
  }
  // cw[ch] = exp(m_ch - M) for every chunk and wden = sum cw[ch] l_ch, in
  // shared memory (block-wide: every thread calls it once, with chunk
  // c.tid's m and l when c.tid < nch).
  KT_DEV void weigh_chunks(Ctx& c, int h, float m, float l) {
    float mx = -INFINITY;
    for (int ch = c.tid; ch < nch; ch += THREADS) mx = fmaxf(mx, ch == c.tid ? m : kt_ld_cg(&c.s->attn_m[ch * MH + h]));
    mx = block_max(c, mx);
    float den = 0;
    for (int ch = c.tid; ch < nch; ch += THREADS) {
      const float mc = ch == c.tid ? m : kt_ld_cg(&c.s->attn_m[ch * MH + h]);
      const float lc = ch == c.tid ? l : kt_ld_cg(&c.s->attn_l[ch * MH + h]);
      const float w = expf(mc - mx);
      c.sm->cw[ch] = w;
      den += w * lc;
    }
    den = block_sum(c, den);  // its barriers also publish cw
    if (c.tid == 0) c.sm->wden = den;
    kt_block_sync();
  }
  KT_DEV void epilogue(Ctx& c, int h, const float* y, Operands) {
#if KT_FLOW
    if (c.tid < VH) flow_put(c, &c.s->flow_o[h * VH + c.tid], kt_f2bf(y[c.tid]));
#else
    if (c.tid < VH) c.s->mla_o[h * VH + c.tid] = kt_f2bf(y[c.tid]);
#endif
  }
};

// ---- MoE ---------------------------------------------------------------------------
// Every block selects the same experts from the logits (rank_experts, by
// value and then index); only when equal logits straddle the top-k boundary
// does the set depend on the tie order: then the exact order of PyTorch's
// CPU top-k decides (topk.h), as in the oracle.

// A router row's logit, as the layer's rankers take it (load_logits).
KT_DEV void write_logit(Ctx& c, int layer, int e, float v) {
#if KT_LOGITS == 1
  kt_st_relaxed(&c.s->logit_words[layer][e], unsigned(kt_f2bf(v)) << 16 | 1u);
#else
  (void)layer;
  c.s->logits[e] = kt_f2bf(v);
#endif
}

// The layer's router logits e = lane and e = lane + 32, by a whole warp.
// KT_LOGITS 0: call after an acquire of router_done (all E rows counted);
// read at L2. KT_LOGITS 1: polled until every word is written, which saves
// the counter's round trip before the logits' own (RESULTS, runs 205-206).
KT_DEV void load_logits(const Ctx& c, int layer, float* v0, float* v1) {
  const int lane = c.lane;
#if KT_LOGITS == 1
  unsigned w0 = 1u, w1 = 1u;
  for (;;) {
    if (lane < E) w0 = kt_ld_relaxed(&c.s->logit_words[layer][lane]);
    if (lane + 32 < E) w1 = kt_ld_relaxed(&c.s->logit_words[layer][lane + 32]);
    if (__all_sync(0xffffffffu, (w0 & 0xffffu) == 1u && (w1 & 0xffffu) == 1u)) break;
    __nanosleep(32);
  }
  *v0 = lane < E ? kt_bf2f(uint16_t(w0 >> 16)) : 0.0f;
  *v1 = lane + 32 < E ? kt_bf2f(uint16_t(w1 >> 16)) : 0.0f;
#else
  (void)layer;
  *v0 = lane < E ? kt_bf2f(kt_ld_cg(&c.s->logits[lane])) : 0.0f;
  *v1 = lane + 32 < E ? kt_bf2f(kt_ld_cg(&c.s->logits[lane + 32])) : 0.0f;
#endif
}

// An expert's key for rank_experts: its bf16 logit's bits made
// unsigned-orderable (-0 as +0, as the float compare has it), then the
// inverted index, so a larger key comes first: the larger logit, and of
// equal ones the lower expert.
KT_DEV unsigned expert_key(float v, int e) {
  unsigned b = __float_as_uint(v) >> 16;
  if ((b & 0x7fffu) == 0) b = 0;
  b = (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
  return b << 16 | unsigned(63 - e);
}

// By one warp: lane r < N - skip gets the expert of the (r + skip)-th
// largest of the warp's keys (two a lane, all distinct, each carrying
// 63 - expert in its bits under index_mask), by N rounds of a warp-wide max.
template <int N>
KT_DEV int rank_keys(int lane, unsigned k0, unsigned k1, int skip, unsigned index_mask) {
  int mine = 0;
#pragma unroll
  for (int r = 0; r < N; ++r) {
    const unsigned most = __reduce_max_sync(0xffffffffu, k0 > k1 ? k0 : k1);
    if (lane == r - skip) mine = 63 - int(most & index_mask);
    k0 = k0 == most ? 0u : k0;
    k1 = k1 == most ? 0u : k1;
  }
  return mine;
}

// The layer's experts from the router's logits, by one warp (every block
// selects them itself, identically): sm->topk, in slot order, and the
// first TOPK + 1 logits in that order (sm->order_v). Each lane holds two
// keys (expert_key); TOPK + 1 rounds of a warp-wide max (redux) take the
// largest out. A bitonic sort of all 64 took 21 dependent rounds of
// shuffles, and ranks by 64 compares a lane ~1 us in one warp (RESULTS,
// runs 145-149). When the k-th and the next logit tie, PyTorch's top-k
// decides (topk.h). v0, v1: the lane's logits e = lane and e = lane + 32
// (load_logits).
KT_DEV void rank_experts(const Ctx& c, float v0, float v1) {
  static_assert(E <= 64 && TOPK < 32 && TOPK < E, "two keys a lane, a rank a lane");
  Smem* sm = c.sm;
  const int lane = c.lane;
  if (lane < E) sm->lv[lane] = v0;
  if (lane + 32 < E) sm->lv[lane + 32] = v1;
  const unsigned k0 = lane < E ? expert_key(v0, lane) : 0u, k1 = lane + 32 < E ? expert_key(v1, lane + 32) : 0u;
  const int mine = rank_keys<TOPK + 1>(lane, k0, k1, 0, 0xffffu);  // lane r <= TOPK: the expert of rank r
  __syncwarp();
  if (lane <= TOPK) sm->order_v[lane] = sm->lv[mine];
  if (lane < TOPK) sm->topk[lane] = mine;
  __syncwarp();
  if (sm->order_v[TOPK - 1] == sm->order_v[TOPK] && lane == 0)
    ktune::kimi::torch_topk(sm->lv, E, TOPK, sm->topk, sm->items);
  __syncwarp();
}

// The selected experts' routing weights (sm->topw), by one warp, after
// rank_experts: softmax over all logits, renormalized over the top k.
KT_DEV void weigh_experts(const Ctx& c, int layer) {
  Smem* sm = c.sm;
  const int lane = c.lane;
  const float pmax = sm->order_v[0];
  const float total = kt_warp_sum((lane < E ? expf(sm->lv[lane] - pmax) : 0.0f) +
                                  (lane + 32 < E ? expf(sm->lv[lane + 32] - pmax) : 0.0f));
  // The weights' sum in slot order, as if every lane added them one by one.
  const float p = lane < TOPK ? expf(sm->lv[sm->topk[lane]] - pmax) / total : 0.0f;
  float wsum = 0;
  for (int j = 0; j < TOPK; ++j) wsum += __shfl_sync(0xffffffffu, p, j);
  if (lane < TOPK) {
    sm->topw[lane] = p / (wsum + 1e-9f) * float(KT_SCALING);
    if (blockIdx.x == 0 && c.a.topk_out) c.a.topk_out[layer * TOPK + lane] = sm->topk[lane];
  }
  if (blockIdx.x == 0 && c.a.logits_out) {
    if (lane < E) c.a.logits_out[layer * E + lane] = kt_f2bf(sm->lv[lane]);
    if (lane + 32 < E) c.a.logits_out[layer * E + lane + 32] = kt_f2bf(sm->lv[lane + 32]);
  }
  __syncwarp();
}

// Where layer's gate (up 0) or up sums of gate/up slot `slot` go, tile
// `tile` of I / TILE (Scratch::gu, one buffer per layer parity).
KT_DEV float* gate_up_sums(const Ctx& c, int layer, int slot, int up, int tile) {
  return &c.s->gu[layer % 2][(slot * 2 + up) * I + tile * TILE];
}

// KT_DOWN_START 1: that tile's counter of chunks added, in a layer's Scratch::gu_ready:
// the gate/up items add to it (MoeAPhase::sums_ready), the down items wait
// on it (DownPhase::wait_for_sums).
KT_DEV constexpr int gate_up_ready_index(int slot, int up, int tile) { return (slot * 2 + up) * (I / TILE) + tile; }

// The MoE's first half in one phase: the router logits (row items, done
// first), the shared experts' gate/up tiles, and the routed experts'
// gate/up tiles. A block reaching its first routed tile waits until all
// router rows are written (a counter, not a grid barrier), then selects the
// experts itself.
struct MoeAPhase : PhaseDefaults {
  const KtMoeLayer& L;
  int layer;
  static constexpr int IT = I / TILE, SHARED_TILES = NSH * 2 * IT;
  KT_DEV int plan_kind() const { return kPlanMoeA; }
  KT_DEV int tiles() const { return SHARED_TILES + RSLOTS * 2 * IT; }
  KT_DEV int nseg(int) const { return 1; }
  KT_DEV int seg_chunks(int) const { return D / CHUNK; }
  KT_DEV bool static_weights(int tile) const { return tile < SHARED_TILES; }
  KT_DEV bool feedable(const Ctx& c, int tile) const { return tile < SHARED_TILES || c.routed; }
  KT_DEV int lead_tiles() const { return SHARED_TILES; }  // the shared experts' (KT_LEAD)
  // slot: the expert's position (routed 0..RSLOTS-1, shared RSLOTS..); up: gate 0 / up 1.
  KT_DEV void slot_of(int tile, int* slot, int* up) const {
    const int t = tile < SHARED_TILES ? tile : tile - SHARED_TILES;
    *slot = (t / (2 * IT)) + (tile < SHARED_TILES ? RSLOTS : 0);
    *up = (t / IT) % 2;
  }
  KT_DEV Seg seg(int tile, int) const;  // needs the block's routing (see before_tile)
  const int* topk = nullptr;  // the routed slots' experts (moe_experts)
  KT_DEV int row_items() const { return (E + WARPS - 1) / WARPS; }
  KT_DEV void row_item(Ctx& c, int item) {
    stamp(c, c.layer, kPointRowStart, true);
    const int e = item * WARPS + c.warp;
    if (e < E) {
      const float v = row_dot(c, L.router + size_t(e) * D);
      if (c.lane == 0) write_logit(c, layer, e, v);
    }
    kt_block_sync();
    if (!KT_LOGITS) publish(c, &c.s->router_done[layer], unsigned(imin(WARPS, E - item * WARPS)));
    if (KT_PROFILE && c.tid == 0) c.row_at = kt_globaltimer();
  }
  KT_DEV void before_tile(Ctx& c, int tile) {
    // KT_PREDICT: the loader streams the predicted experts' stages; the
    // consumers need the routing only for the down phase.
    if (tile >= SHARED_TILES && !KT_PREDICTED) route(c, true);
  }
  KT_DEV void after_sums(Ctx& c, int tile) {
    if (KT_PROFILE && tile >= SHARED_TILES && !c.routed_at) c.routed_at = kt_globaltimer();
  }
  // Waits for the router logits, then selects this layer's experts (once);
  // with the loader warp (KT_FEED 4), waits for its selection (loader_route).
  // tiles: the block goes on with its first routed tile (profile).
  KT_DEV void route(Ctx& c, bool tiles = false) {
    if (c.routed) return;
    stamp_event(c, kEventRoutedReached, tiles ? 0 : ~0ull);
    stamp_event(c, kEventRowPublished, c.row_at ? c.row_at : ~0ull);
    c.row_at = 0;
#if KT_FEED == 4
    if (c.tid == 0) loader_wait(&c.sm->routed_layers, unsigned(layer + 1));
    kt_block_sync();
    stamp_event(c, kEventLogitsSeen, c.sm->route_at[0]);
    stamp_event(c, kEventRouted, c.sm->route_at[1]);
    if (c.warp == 0) weigh_experts(c, layer);  // while the loader's first routed stages land
#else
    if (!KT_LOGITS) wait_for(c, &c.s->router_done[layer], unsigned(E));
    stamp_event(c, kEventLogitsSeen);
    if (c.warp == 0) {
      float v0, v1;
      load_logits(c, layer, &v0, &v1);
      rank_experts(c, v0, v1);
      weigh_experts(c, layer);
    }
    stamp_event(c, kEventRouted);
#endif
    kt_block_sync();
    c.routed = true;
  }
  KT_DEV float* gu_tile(const Ctx& c, int tile) const {
    int slot, up;
    slot_of(tile, &slot, &up);
    return gate_up_sums(c, layer, slot, up, tile % IT);
  }
  KT_DEV void epilogue(Ctx& c, int tile, const float* y, Operands) {
    if (c.tid < TILE) gu_tile(c, tile)[c.tid] = y[c.tid];
  }
  KT_DEV float* tile_sums(const Ctx& c, int tile) const { return KT_MOE_REDUCE == 1 ? gu_tile(c, tile) : nullptr; }
#if KT_DOWN_START == 1
  KT_DEV unsigned* sums_ready(const Ctx& c, int tile) const {
    int slot, up;
    slot_of(tile, &slot, &up);
    return &c.s->gu_ready[layer][gate_up_ready_index(slot, up, tile % IT)];
  }
#endif
};

// Tile `tile` (of I / TILE) of expert e's gate (up 0) or up projection.
KT_DEV Seg expert_in_seg(const KtMoeLayer& L, size_t rp, bool shared, int up, size_t e, int tile) {
  const KtW4& w = shared ? (up ? L.s_up : L.s_gate) : (up ? L.up : L.gate);
  return make_seg(w.w_q + e * (D / 2) * I, w.scales + e * (D / G) * I, w.zeros + e * (D / G) * I, I, tile * TILE,
                  rp + moe_repack(shared, up, int(e)), D / G);
}

KT_DEV Seg MoeAPhase::seg(int tile, int) const {
  int slot, up;
  slot_of(tile, &slot, &up);
  const bool shared = slot >= RSLOTS;
  return expert_in_seg(L, rp, shared, up, shared ? size_t(slot - RSLOTS) : size_t(topk[slot]), tile % IT);
}

// The routed slots' experts of layer's gate/up phase: the routing's, or
// with KT_PREDICT the predicted ones (the loader's).
KT_DEV int* moe_experts(const Ctx& c, int layer) {
#if KT_PREDICTED
  return c.sm->pred[layer % 2];
#else
  (void)layer;
  return c.sm->topk;
#endif
}

#if KT_PREDICTED
// KT_PREDICT, when some of the routing's experts were not predicted (top9:
// none in the CPU study's 496 layer-steps; top8: ~3%; tests force it with
// KT_PREDICT_MISS): all of the routing's experts' gate/up again, on the
// gate/up phase's staged input, into gate/up slots RSLOTS + NSH + s
// (match_prediction). After a grid barrier: the gate/up phase's k-split
// counters and partials are free.
struct MoeFixPhase : PhaseDefaults {
  const KtMoeLayer& L;
  int layer;
  const int* topk;
  static constexpr int IT = I / TILE;
  KT_DEV int plan_kind() const { return kPlanMoeFix; }
  KT_DEV int tiles() const { return TOPK * 2 * IT; }
  KT_DEV int nseg(int) const { return 1; }
  KT_DEV int seg_chunks(int) const { return D / CHUNK; }
  KT_DEV bool static_weights(int) const { return false; }
  KT_DEV bool feedable(const Ctx& c, int) const { return c.routed; }
  KT_DEV Seg seg(int tile, int) const {
    return expert_in_seg(L, rp, false, (tile / IT) % 2, size_t(topk[tile / (2 * IT)]), tile % IT);
  }
  KT_DEV float* gu_tile(const Ctx& c, int tile) const {
    return gate_up_sums(c, layer, RSLOTS + NSH + tile / (2 * IT), (tile / IT) % 2, tile % IT);
  }
  KT_DEV void epilogue(Ctx& c, int tile, const float* y, Operands) {
    if (c.tid < TILE) gu_tile(c, tile)[c.tid] = y[c.tid];
  }
  KT_DEV float* tile_sums(const Ctx& c, int tile) const { return KT_MOE_REDUCE == 1 ? gu_tile(c, tile) : nullptr; }
};
#endif

// All experts' down projections as one GEMV over the concatenated
// activations, each pre-scaled by its routing weight; output x = h + bf16(y).
struct DownPhase : PhaseDefaults {
  const KtMoeLayer& L;
  const int* topk;
  const float* topw;
  const uint16_t* h;
  uint16_t* out;
  float* sums;  // KT_REDUCE 1: where the items add their sums; nullptr in the last layer (its output leaves the launch)
  const float* gu;  // the layer's gate and up sums (Scratch::gu)
  unsigned* tagged = nullptr;  // KT_FLOW 1: the next layer's x as tagged words too, for its staging
  const unsigned* ready = nullptr;  // KT_DOWN_START 1: the layer's gu_ready (MoeAPhase::sums_ready)
  static constexpr int IT = I / TILE;
  KT_DEV float* carry_sums() const { return KT_REDUCE == 1 ? sums : nullptr; }
  KT_DEV float* tile_sums(const Ctx&, int tile) const { return KT_REDUCE == 1 && sums ? sums + tile * TILE : nullptr; }
  KT_DEV bool feedable(const Ctx& c, int) const { return c.routed; }  // seg() reads the block's routing
  KT_DEV int plan_kind() const { return kPlanDown; }
  KT_DEV int tiles() const { return D / TILE; }
  KT_DEV int nseg(int) const { return SLOTS; }
  KT_DEV int seg_chunks(int) const { return I / CHUNK; }
  KT_DEV Seg seg(int tile, int s) const {
    const bool shared = s >= TOPK;
    const KtW4& w = shared ? L.s_down : L.down;
    const size_t e = shared ? size_t(s - TOPK) : size_t(topk[s]);
    return make_seg(w.w_q + e * (I / 2) * D, w.scales + e * (I / G) * D, w.zeros + e * (I / G) * D, D, tile * TILE,
               rp + moe_repack(shared, 2, int(e)), I / G);
  }
  // Where segment s's gate/up sums are (MoeAPhase::gu_tile): routed slot
  // s, shared slot RSLOTS + s - TOPK; with KT_PREDICT, the routing's slot s
  // where match_prediction found it.
  KT_DEV int gu_slot(const Ctx& c, int s) const {
#if KT_PREDICTED
    return s < TOPK ? c.sm->gslot[s] : RSLOTS + s - TOPK;
#else
    (void)c;
    return s < TOPK ? s : RSLOTS + s - TOPK;
#endif
  }
  // KT_DOWN_START 1, no grid barrier before the phase: waits until every
  // gate/up tile the item's k range [kc0, kc1) reads, its gate and its up,
  // has all D / CHUNK chunks of its sums in. A thread a counter, so that
  // their round trips overlap; the block barrier then orders every
  // thread's reads of gu after the acquires.
  KT_DEV void wait_for_sums(Ctx& c, int kc0, int kc1) const {
    const int t0 = kc0 * CHUNK / TILE, t1 = (kc1 * CHUNK + TILE - 1) / TILE;  // TILE-wide pieces of down's K
    for (int j = c.tid; j < 2 * (t1 - t0); j += THREADS) {
      const int t = t0 + j / 2;
      const unsigned* r = &ready[gate_up_ready_index(gu_slot(c, t / IT), j % 2, t % IT)];
      while (kt_ld_acquire(r) < unsigned(D / CHUNK)) __nanosleep(32);
    }
    kt_block_sync();
  }
  // The item's activations silu(g) * u * w, four values (two pairs) per
  // thread and trip, loads issued in batches of B before they are used.
  KT_DEV void stage(Ctx& c, int, int kc0, int kc1) {
    if (KT_DOWN_START) wait_for_sums(c, kc0, kc1);
    constexpr int B = 4;
    const int q0 = kc0 * 4, q1 = kc1 * 4;  // quads of k
    for (int base = q0; base < q1; base += B * THREADS) {
      float4 g[B], u[B];
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const int q = base + c.tid + b * THREADS, s = 4 * q / I, i = 4 * q % I;
        if (q < q1) {
          const int gs = gu_slot(c, s);
          g[b] = kt_ld_cg(reinterpret_cast<const float4*>(&gu[(gs * 2) * I + i]));
          u[b] = kt_ld_cg(reinterpret_cast<const float4*>(&gu[(gs * 2 + 1) * I + i]));
        }
      }
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const int q = base + c.tid + b * THREADS, s = 4 * q / I;
        if (q < q1) {
          const float w = s < TOPK ? topw[s] : 1.0f;
          stage_f32_pair(c, 2 * q, kt_silu(g[b].x) * u[b].x * w, kt_silu(g[b].y) * u[b].y * w);
          stage_f32_pair(c, 2 * q + 1, kt_silu(g[b].z) * u[b].z * w, kt_silu(g[b].w) * u[b].w * w);
        }
      }
    }
    kt_block_sync();
  }
  using Operands = Residual;
  KT_DEV Operands operands(const Ctx& c, int tile) const { return residual_of(c, h, tile); }
  KT_DEV void epilogue(Ctx& c, int tile, const float* y, Operands r) { add_residual(c, out, tile, y, r, tagged); }
};

// Before phase p: start what p can load without the barrier's data (L2
// prefetch, the first shared-memory stages), then wait for the grid. p's
// item numbering is made once: before the barrier when those need it, else
// between the block's arrival and the grid's. grid false (KT_FLOW 1's
// points, flow_tag): all of that but the grid barrier, whose arrival the
// profile still records; p's staging polls its input's tagged words.
template <class P>
KT_DEV void barrier_before(Ctx& c, P& p, bool grid = true) {
  constexpr bool numbered_first = KT_PREFETCH || (KT_STAGES > 0 && KT_EARLY && KT_FEED != 4);
  auto number = [&] {
    if (KT_NUMBERING >= 1) return;  // numbered when the launch started
    c.plan = number_items(p);
    c.plan_phase = c.gemv_phases;  // p is the next run_gemv_phase
  };
  if (numbered_first) number();
  if (KT_PREFETCH) stamp(c, c.layer, kPhasePrefetch);
  prefetch_phase(c, p);
  early_issue(c, p);
  grid ? barrier_arrive(c) : mark_arrival(c);
  if (!numbered_first) number();
  if (grid) barrier_wait(c);
#if KT_HOLD_ON && KT_HOLD_RELEASE == 1
  // The loader's held stages go out once the grid is past the barrier, as
  // the phase's staging starts, rather than after it (run_gemv_phase).
  signal_loader(c, &c.sm->gemv_started, unsigned(c.gemv_phases + 1));
#endif
}

// o_proj of either attention: h = x + bf16(o @ W), o (bf16 [K]) staged once.
KT_DEV OprojPhase make_oproj(Ctx& c, int layer, const KtW4& w, int K, const uint16_t* x) {
  const size_t o_rp = layer_repack(layer) + (m_layer(layer) ? kMlaO : 4 * repack_bytes(D, C));
#if KT_FLOW_HX
  return OprojPhase{{}, OneMatrix{w, D, K, o_rp}, x, c.s->hbuf, c.s->carry[layer][0], c.s->flow_h};
#else
  return OprojPhase{{}, OneMatrix{w, D, K, o_rp}, x, c.s->hbuf, c.s->carry[layer][0]};
#endif
}

// Runs GEMV phase p; with the bulk feed, np is the next GEMV phase (nothing
// between them uses the ring), whose first stages stream behind p's last.
template <class P, class NP>
KT_DEV void run_gemv_phase_before(Ctx& c, P& p, const NP& np) {
#if KT_FEED == 3
  run_gemv_phase(c, p, &np);
#else
  (void)np;
  run_gemv_phase(c, p);
#endif
}

// abi.h's attn_out: the layer's attention output o as o_proj stages it.
// Every block holds all of it in shared memory; the first blocks copy it
// out, 16 bytes a thread.
KT_DEV void report_attn_out(const Ctx& c, int layer, int K) {
  if (!c.a.attn_out) return;
  uint4* dst = reinterpret_cast<uint4*>(c.a.attn_out + size_t(layer) * KT_ATTN_OUT_STRIDE(C, MO));
  for (int v = int(blockIdx.x) * THREADS + c.tid; v < K / 8; v += int(gridDim.x) * THREADS)
    dst[v] = reinterpret_cast<const uint4*>(c.sm->xs_hi)[v];
}

template <class NP>
KT_DEV void oproj_phase(Ctx& c, int layer, OprojPhase& oproj, int K, const uint16_t* o, const NP& next) {
  barrier_before(c, oproj, !KT_FLOW);
#if KT_PREDICTED
  signal_loader(c, &c.sm->o_layers, unsigned(layer + 1));  // o is complete: predictor_main
#endif
  stamp(c, layer, 4);
#if KT_FLOW
  stage_bf16(c, o, K, c.s->flow_o, c.tag);
#else
  stage_bf16(c, o, K);
#endif
  report_attn_out(c, layer, K);
  run_gemv_phase_before(c, oproj, next);
#if KT_PREDICTED
  signal_loader(c, &c.sm->oproj_layers, unsigned(layer + 1));  // loader_predict may poll now
#endif
}

// x: the layer's input (o_proj's residual, for KT_REDUCE 1's staging).
// moe_a: this layer's gate/up phase (its first stages may be in flight).
KT_DEV void moe_layer(Ctx& c, int layer, const KtLayer& Ly, MoeAPhase& moe_a, const uint16_t* x, uint16_t* x_next) {
  const KtMoeLayer& L = Ly.moe;
  DownPhase down{{moe_layer_repack(layer)}, L, c.sm->topk, c.sm->topw, c.s->hbuf, x_next,
                 layer < KT_LAYERS - 1 ? c.s->carry[layer][1] : nullptr, c.s->gu[layer % 2]};
  stamp(c, layer, 5);
#if KT_DOWN_START == 1
  down.ready = c.s->gu_ready[layer];
#endif
#if KT_FLOW_HX
  if (layer < KT_LAYERS - 1) down.tagged = c.s->flow_x;
  stage_block_input(c, c.s->hbuf, x, Ly.moe_norm, c.s->hbuf, c.s->flow_h, c.tag);
#else
  stage_block_input(c, c.s->hbuf, x, Ly.moe_norm, c.s->hbuf);
#endif
  stamp_event(c, kEventStaged);
  c.routed = false;
  run_gemv_phase_before(c, moe_a, down);
  moe_a.route(c);  // every block needs the routing for the down phase
#if KT_PREDICTED
  if (KT_PREDICT_FIX && c.sm->miss) {  // every block's loader found the same (match_prediction)
    MoeFixPhase fix{{moe_layer_repack(layer)}, L, layer, c.sm->topk};
    barrier_before(c, fix);
    stamp(c, layer, 6);
    run_gemv_phase(c, fix);
  }
#endif
  stamp_event(c, kEventRoutedComputed, c.routed_at ? c.routed_at : ~0ull);
  c.routed_at = 0;
  // KT_DOWN_START 1: no grid barrier; each down item waits for the gate/up
  // tiles it reads (DownPhase::wait_for_sums). The barrier also ordered
  // nothing else the down phase touches: the gate/up items used no k-split
  // counters or partials (their sums go by atomics), and every block routes
  // for itself.
  barrier_before(c, down, !KT_DOWN_START);
  stamp(c, layer, 7);
#if KT_FEED == 3
  // The next layer's first GEMV phase streams behind the down phase.
  if (layer + 1 < KT_LAYERS && m_layer(layer + 1)) {
    const Mla1Phase next{{layer_repack(layer + 1)}, c.a.layers[layer + 1].mla, c.a.context};
    run_gemv_phase(c, down, &next);
  } else if (layer + 1 < KT_LAYERS) {
    const QkvgPhase next{{layer_repack(layer + 1)}, c.a.layers[layer + 1].kda, layer + 1};
    run_gemv_phase(c, down, &next);
  } else {
    run_gemv_phase(c, down);
  }
#else
  run_gemv_phase(c, down);
#endif
  // The routing is this layer's: the next layer's o_proj must not name a
  // routed gate/up tile with it (feedable).
  c.routed = false;
}

// KT_MOE_REDUCE 1: the gate/up sums of the layer before (of the last
// launch's last layer, at layer 0) start again at zero, for the next layer
// to add into. Its down phase read them: with KT_FLOW 0 the barrier before
// this layer's first phase (or the launch boundary) ended it, and the call
// comes after it; with KT_FLOW 1 that barrier is gone and the call comes
// after the layer's first remaining one. The next layer adds into the
// buffer only after this layer's down barrier.
KT_DEV void zero_spent_gu(Ctx& c, int layer) {
  if (KT_MOE_REDUCE != 1) return;
  const int spent = layer > 0 ? (layer - 1) % 2 : (KT_LAYERS - 1) % 2;
  for (int i = int(blockIdx.x) * THREADS + c.tid; i < GU_SLOTS * 2 * I; i += int(gridDim.x) * THREADS)
    c.s->gu[spent][i] = 0.0f;
}

// The input of a layer's first phase: RMSNorm(x) (stage_block_input); with
// KT_FLOW 1 after layer 0, x's tagged words, which the layer before wrote.
KT_DEV void stage_layer_input(Ctx& c, int layer, const uint16_t* x, const uint16_t* w, uint16_t* x_carried) {
#if KT_FLOW_HX
  if (layer > 0) {
    stage_block_input(c, x, c.s->hbuf, w, x_carried, c.s->flow_x, flow_tag(c, layer - 1));
    return;
  }
#else
  (void)layer;
#endif
  stage_block_input(c, x, c.s->hbuf, w, x_carried);
}

// The shape of GEMV phase kind `kind` (a PlanKind), from layer 0's
// arguments: a phase's shape does not depend on its layer.
KT_DEV PhaseShape plan_shape(const KimiDeviceArgs& a, int kind) {
  const KtLayer& L0 = a.layers[0];
  switch (kind) {
    case kPlanQkvg: return shape_of(QkvgPhase{{0}, L0.kda, 0});
    case kPlanMla1: return shape_of(Mla1Phase{{0}, L0.mla, a.context});
    case kPlanOprojK: return shape_of(OprojPhase{{}, OneMatrix{L0.kda.o, D, C, 0}, nullptr, nullptr, nullptr});
    case kPlanOprojM: return shape_of(OprojPhase{{}, OneMatrix{L0.mla.o, D, MO, 0}, nullptr, nullptr, nullptr});
    case kPlanWuv: return shape_of(WuvPhase{{0}, L0.mla, 0});
    case kPlanMoeA: return shape_of(MoeAPhase{{0}, L0.moe, 0, nullptr});
#if KT_PREDICTED
    case kPlanMoeFix: return shape_of(MoeFixPhase{{0}, L0.moe, 0, nullptr});
#endif
    default: return shape_of(DownPhase{{0}, L0.moe, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr});
  }
}

// KT_NUMBERING 1: each kind of GEMV phase's numbering into c.sm->plans,
// when the launch starts: warp w works out kinds w, w + WARPS, ..., one
// inlined copy of the search for all kinds. The loader warp numbers its own
// phases as it reaches them: when it reached the routing ~1 us sooner, the
// layer whose top-k ties streamed its routed stages ~3 us later (RESULTS,
// runs 177-179). The caller syncs the block after.
#if KT_NUMBERING == 1
KT_DEV void make_plans(Ctx& c) {
  for (int kind = c.warp; kind < kPlanKinds; kind += WARPS) {
    const ItemPlan pl = number_items(plan_shape(c.a, kind));
    if (c.lane == 0) c.sm->plans[kind] = pl;
  }
}
#endif

#if KT_NUMBERING >= 2
// KT_NUMBERING 2, in the prepare table: warp w of block 0 numbers kind w
// for the step's grid, which has KT_BLOCKS_PER_SM blocks an SM where this
// launch has kPrepareBlocksPerSm (both launches are sized per SM).
static_assert(kPlanKinds <= kPrepareThreads / 32, "a warp a kind of phase");
// KT_NUMBERING 3: then the block lists every kind's items (ItemMap::number).
KT_DEV void prepare_plans(const KimiDeviceArgs& a) {
  const int warp = int(threadIdx.x) / 32, blocks = int(gridDim.x) / kPrepareBlocksPerSm * KT_BLOCKS_PER_SM;
  if (blockIdx.x != 0) return;
  Scratch* s = reinterpret_cast<Scratch*>(a.scratch);
  if (warp < kPlanKinds) {
    const ItemPlan pl = number_items(plan_shape(a, warp), blocks);
    if (threadIdx.x % 32 == 0) s->plans[warp] = pl;
  }
  if (threadIdx.x == 0) s->plans_grid = blocks + KT_TEST_PLANS_GRID;
#if KT_NUMBERING == 3
  __syncthreads();  // the block's plans are written (and seen by the block)
  constexpr int kItemsMax = KT_TEST_ITEMS_MAX > 0 ? KT_TEST_ITEMS_MAX : kMaxItems;
  for (int kind = 0; kind < kPlanKinds; ++kind) {
    const ItemMap map(s->plans[kind]);
    if (map.items > kItemsMax) __trap();  // the table's row would overflow (no grid of the launch tables comes near)
    for (int it = map.rows + int(threadIdx.x); it < map.items; it += int(blockDim.x))
      s->item_table[kind][it] = pack_item(map.number(it, blocks));
  }
#endif
}

// Each launch's start, before the block's first barrier (the loader warp
// reads them too): the prepare table's numberings into shared memory, a
// word a thread. They hold for the grid they were made for; every launcher
// sizes both launches per SM as the launch tables say (the runner, the
// emulator, export/kimi_ext.cu), so another grid is a launcher's bug, and
// the block traps rather than run a numbering that skips or repeats items.
// So the phase boundaries run no search: ~40 KB of code a step that came
// from L2 each time (RESULTS, runs 249-250).
// KT_NUMBERING 3: and the block's first kBlockItems items of each kind,
// an item a thread (the next threads), so no step runs ItemMap::number
// (~20 KB of code, most of it cold: RESULTS, run 254).
KT_DEV void load_plans(Ctx& c) {
  constexpr int kWords = kPlanKinds * int(sizeof(ItemPlan) / sizeof(int));
  static_assert(sizeof(ItemPlan) % sizeof(int) == 0 && kWords <= THREADS, "a word a thread");
  if (c.s->plans_grid != int(gridDim.x)) __trap();
  if (c.tid < kWords) reinterpret_cast<int*>(c.sm->plans)[c.tid] = reinterpret_cast<const int*>(c.s->plans)[c.tid];
#if KT_NUMBERING == 3
  static_assert(kWords + kPlanKinds * kBlockItems <= THREADS, "an item a thread");
  const int t = c.tid - kWords, kind = t / kBlockItems, nth = t % kBlockItems;
  if (t >= 0 && kind < kPlanKinds) {
    const int it = int(blockIdx.x) + nth * int(gridDim.x);
    if (it < c.s->plans[kind].items) c.sm->block_items[kind][nth] = c.s->item_table[kind][it];
  }
#endif
}
#endif

// The loader's numbering of phase p: its own search, or the prepare table's.
template <class P>
KT_DEV ItemMap loader_map(const Ctx& c, const P& p) {
#if KT_NUMBERING >= 2
  return kind_map(c, p.plan_kind());
#else
  (void)c;
  return ItemMap(number_items(p));
#endif
}

#if KT_FEED == 4
// ---- the loader warp (KT_FEED 4) ------------------------------------------------------
// The first warp of a fourth warpgroup walks the block's stages of every GEMV
// phase of the step in the order the consumers take them (each phase's
// ItemMap dealt round-robin, each item's groups in order) and bulk-copies
// each into the ring's next slot once its consumers have released it
// (feed_raw). It never waits at a grid barrier, so while the consumers wait
// there the ring fills with the next phase's first stages, and no item starts
// from an empty ring (the GEMV engine's v11 design). It waits only where the
// weights are not yet named or the ring's memory is lent: the routed experts'
// tiles until the router's logits are in (it then selects the experts
// itself: loader_route), and an M layer's wuv phase until the attention
// (whose row tiles use the same memory) is done.

#if KT_PREDICTED
// KT_PREDICT: the predictor warps, the loader warpgroup's other three (they
// only lent their registers before), predict every layer's router logits
// before h exists: pred_e = o . M_e + x . (w R_e), with M = Wo diag(w) R^T
// (w the MoE norm's weights, R the router, x the layer's input, o the
// attention output; predict_tables). The router's logits are RMSNorm's
// positive scale times this, up to the bf16 roundings: the exact experts
// were the predicted top TOPK in 97% and within the top TOPK + 1 in all
// 496 layer-steps of the CPU study (build/routing_prediction; RESULTS,
// nineteenth session). Each dot of K + D is cut into kPredParts parts, a
// warp a part (one round of loads, off the consumers' path), published as
// words that carry their validity (bit 0 set; 0 is unwritten).
KT_DEV void predictor_main(Ctx& c) {
  constexpr int kChunks = (PRED_K + D) / 8, kPerLane = cdiv(cdiv(kChunks, kPredParts), 32);
  const int lane = c.lane, warps = int(gridDim.x) * 3, me = int(blockIdx.x) * 3 + c.warp - WARPS - 1;
  for (int layer = 0; layer < KT_LAYERS; ++layer) {
    const bool m = m_layer(layer);
    const int K = m ? MO : C, chunks = (K + D) / 8;
    const uint16_t* o = m ? c.s->mla_o : c.s->kda_o;
    const uint16_t* x = layer == 0 ? c.a.x_in : c.s->xbuf[layer % 2];
    loader_wait(&c.sm->o_layers, unsigned(layer + 1));
    for (int job = me; job < E * kPredParts; job += warps) {
      const int e = job / kPredParts, part = job % kPredParts;
      const int c0 = part * chunks / kPredParts, c1 = (part + 1) * chunks / kPredParts;
      const uint16_t* t = c.s->pred_table[layer][e];
      uint4 tv[kPerLane], vv[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int ch = c0 + lane + 32 * i, k = 8 * ch;
        const bool in = ch < c1;
        tv[i] = in ? kt_ld_weights<0>(k < K ? t + k : t + PRED_K + (k - K)) : make_uint4(0, 0, 0, 0);
        vv[i] = in ? kt_ld_cg(reinterpret_cast<const uint4*>(k < K ? o + k : x + (k - K))) : make_uint4(0, 0, 0, 0);
      }
      float acc = 0;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t a = word_of(vv[i], j), b = word_of(tv[i], j);
          acc += kt_lo(a) * kt_lo(b) + kt_hi(a) * kt_hi(b);
        }
      acc = kt_warp_sum(acc);
      if (lane == 0) kt_st_relaxed(&c.s->pred_words[layer][e][part], __float_as_uint(acc) | 1u);
    }
  }
}

// KT_PREDICT: the layer's predicted experts (the top RSLOTS of the
// predicted logits, polled until all their parts are written by the
// predictor warps: predictor_main) into sm->pred, by the loader. Every
// block's loader ranks the same words the same way, so all agree. An
// expert's key: the logit's bits made unsigned-orderable, the low 6
// replaced by the inverted index.
// KT_PREDICT_MISS (tests) drops the best, so the routing misses one.
KT_DEV void loader_predict(Ctx& c, int layer) {
  static_assert(E <= 64 && RSLOTS < 32 && RSLOTS < E, "two keys a lane, a rank a lane");
  const int lane = c.lane;
  // Lane l sums the parts of experts l and l + 32, in part order.
  auto prediction = [&](int e, bool* ready) {
    float v = 0;
    for (int p = 0; p < kPredParts; ++p) {
      const unsigned w = e < E ? kt_ld_relaxed(&c.s->pred_words[layer][e][p]) : 1u;
      *ready = *ready && w != 0u;
      v += __uint_as_float(w);
    }
    return v;
  };
  // Not before this block's o_proj items are done, and slowly: 132 warps
  // polling these lines from the KDA phase on slowed it and o_proj by ~4 us
  // a layer (RESULTS, run 212), and from o_proj's start on, o_proj's k-split
  // gathers by ~2 us (run 213).
  loader_wait(&c.sm->oproj_layers, unsigned(layer + 1));
  float v0, v1;
  for (;;) {
    bool ready = true;
    v0 = prediction(lane, &ready);
    v1 = prediction(lane + 32, &ready);
    if (__all_sync(0xffffffffu, ready)) break;
    __nanosleep(256);
  }
  auto key = [](float v, int e) {
    unsigned b = __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return (b & ~63u) | unsigned(63 - e);
  };
  const unsigned k0 = lane < E ? key(v0, lane) : 0u, k1 = lane + 32 < E ? key(v1, lane + 32) : 0u;
  const int mine = rank_keys<RSLOTS + KT_PREDICT_MISS>(lane, k0, k1, KT_PREDICT_MISS, 63u);
  if (lane < RSLOTS) c.sm->pred[layer % 2][lane] = mine;
  __syncwarp();
}

// KT_PREDICT_STREAM 1: the loader holds the predicted experts' stages until
// the stages it issued before them (o_proj's, the shared experts') have
// landed, so that o_proj's weights do not share DRAM with them.
KT_DEV void loader_landed(Ctx& c) {
  if (feeds(c) && c.fed > 0) {
    const unsigned k = c.fed - 1;
    kt_mbar_wait(&c.sm->full[k % STAGES], (k / STAGES) & 1);
  }
  __syncwarp();
}

// KT_PREDICT: after rank_experts, by the loader: the gate/up slot of each
// of the routing's experts (the predicted slot that computed it), or, if
// any is missing, the fix phase's slots for all of them (sm->miss).
KT_DEV void match_prediction(Ctx& c, int layer) {
  const int lane = c.lane;
  int slot = -1;
  if (lane < TOPK)
    for (int p = 0; p < RSLOTS; ++p)
      if (c.sm->pred[layer % 2][p] == c.sm->topk[lane]) slot = p;
  const bool miss = __any_sync(0xffffffffu, lane < TOPK && slot < 0);
  if (lane < TOPK) c.sm->gslot[lane] = miss ? RSLOTS + NSH + lane : slot;
  if (lane == 0) c.sm->miss = miss ? 1 : 0;
  __syncwarp();
}
#endif

// The loader selects the layer's experts itself, as soon as the router's
// logits are in: the consumers may still be busy with the phase's first
// items (the shared expert's), and the routed stages then stream behind
// them (RESULTS, runs 147-149). It tells the consumers by routed_layers.
KT_DEV void loader_route(Ctx& c, int layer) {
  if (*reinterpret_cast<volatile unsigned*>(&c.sm->routed_layers) >= unsigned(layer + 1)) return;
  if (!KT_LOGITS && c.lane == 0)
    while (kt_ld_acquire(&c.s->router_done[layer]) < unsigned(E)) __nanosleep(32);
  __syncwarp();
  // Profile: the logits are seen when the counter is in (0) or every word is (1).
  if (KT_PROFILE && !KT_LOGITS && c.lane == 0) c.sm->route_at[0] = kt_globaltimer();
  float v0, v1;
  load_logits(c, layer, &v0, &v1);
  if (KT_PROFILE && KT_LOGITS && c.lane == 0) c.sm->route_at[0] = kt_globaltimer();
  rank_experts(c, v0, v1);  // the consumers weigh them
#if KT_PREDICTED
  match_prediction(c, layer);
#endif
  if (c.lane == 0) {
    if (KT_PROFILE) c.sm->route_at[1] = kt_globaltimer();
    __threadfence_block();
    *reinterpret_cast<volatile unsigned*>(&c.sm->routed_layers) = unsigned(layer + 1);
  }
  __syncwarp();
}

// The block's items of a phase (numbered by map), each item's stages into
// the ring in the consumers' order; before(item) runs ahead of each.
// KT_HOLD n: the phase's stages after its first n wait until the block's
// consumers have begun the phase (past the grid barrier before it), so that
// fewer copies are in flight while the boundary's hand-offs, barrier and
// cold code wait on L2 (each waits behind the copies in flight: RESULTS,
// run 250).
// KT_HOLD_SCOPE 1 counts the held stages across phases instead: at most n
// stages of all the phases the consumers have not begun. Behind a run of
// short phases (KDA 3 stages a block, o_proj 4, the router 3) a per-phase
// hold lets the loader run a dozen stages ahead. The step_shape study
// measured the megakernel's phase shape 7% shorter with this bound at 4-6
// than with the per-phase hold 2 (RESULTS, run 309), but the megakernel
// itself 2-4 us slower at holds 2, 4 and 6 (run 310): its boundaries'
// hand-offs wait behind the stages issued ahead, which the study's lack.
#if KT_HOLD_ON && KT_HOLD_SCOPE == 1
KT_DEV void hold_ahead(Ctx& c, unsigned phase) {
  for (;;) {
    const unsigned begun = *reinterpret_cast<const volatile unsigned*>(&c.sm->gemv_started);
    if (begun >= phase || c.fed - c.sm->fed_start[begun + 1] < unsigned(KT_HOLD)) break;
    __nanosleep(20);
  }
  __threadfence_block();
}
#endif
template <class P, class Before>
KT_DEV void feed_items(Ctx& c, const P& p, const ItemMap& map, Before before) {
#if KT_HOLD_ON
  const unsigned phase = ++c.fed_phases;
#if KT_HOLD_SCOPE == 1
  c.sm->fed_start[phase] = c.fed;
#else
  int issued = 0;  // this phase's stages fed so far (the per-phase hold)
#endif
#endif
  for (int it = int(blockIdx.x), nth = 0; it < map.items; it += int(gridDim.x), ++nth) {
    if (it < map.rows) continue;
    const Item item = map.item(it, nth);
    before(item);
#if KT_HOLD_ON
    const int g0 = item.kc0 / STAGE_CHUNKS;
    for (int q = 0; q < (item.kc1 - item.kc0) / STAGE_CHUNKS; ++q) {
#if KT_HOLD_SCOPE == 1
      hold_ahead(c, phase);
#else
      if (issued++ == KT_HOLD) loader_wait(&c.sm->gemv_started, phase);
#endif
      feed_raw(c, stage_offset(p, item.tile, g0 + q));
    }
#else
    feed_item_stages(c, p, item.tile, item.kc0 / STAGE_CHUNKS, 0, (item.kc1 - item.kc0) / STAGE_CHUNKS);
#endif
  }
}

// One GEMV phase's stages of this block. attentions > 0: first wait for
// that many attention phases to end (the ring's memory is lent to them),
// after the numbering, whose search is then off that wait's path.
template <class P>
KT_DEV void load_phase(Ctx& c, const P& p, unsigned attentions = 0) {
  const ItemMap map = loader_map(c, p);
  if (attentions > 0) loader_wait(&c.sm->attentions, attentions);
  feed_items(c, p, map, [](const Item&) {});
}

// A MoE layer's two phases. The down phase's numbering (split_for's
// search, ~1 us in one warp) is made while the loader waits for the router
// (it does not depend on the routing), so the down phase's first copies
// follow the gate/up phase's last at once.
KT_DEV void load_moe(Ctx& c, int layer, const KtMoeLayer& L) {
  const MoeAPhase up{{moe_layer_repack(layer)}, L, layer, moe_experts(c, layer)};
  const DownPhase down{{moe_layer_repack(layer)}, L, c.sm->topk, c.sm->topw, nullptr, nullptr, nullptr, nullptr};
  ItemMap down_map;
  bool planned = false;
#if KT_PREDICTED
  // The routed tiles' experts are the predicted ones, known before the
  // phase starts; the routing is needed only for the down phase.
  bool predicted = false;
  auto predict = [&] {
    if (predicted) return;
    predicted = true;
    loader_predict(c, layer);
    if (KT_PREDICT_STREAM == 1) loader_landed(c);
  };
#endif
  feed_items(c, up, loader_map(c, up), [&](const Item& item) {
    if (up.static_weights(item.tile)) return;
    if (!planned) down_map = loader_map(c, down);
    planned = true;
#if KT_PREDICTED
    predict();
#else
    loader_route(c, layer);
#endif
  });
  if (!planned) down_map = loader_map(c, down);
#if KT_PREDICTED
  predict();  // every block's loader matches the routing to the prediction
#endif
  loader_route(c, layer);  // the down phase reads every routed expert
#if KT_PREDICTED
  if (KT_PREDICT_FIX && c.sm->miss) {
    const MoeFixPhase fix{{moe_layer_repack(layer)}, L, layer, c.sm->topk};
    feed_items(c, fix, loader_map(c, fix), [](const Item&) {});
  }
#endif
  feed_items(c, down, down_map, [](const Item&) {});
}

// The next launch starts with layer 0's first GEMV phase and an empty ring:
// every block's first STAGES stages come from DRAM at once (~13 MB, ~3 us)
// while the consumers wait. Those stages are static, so the loader, done with
// this launch's stages, prefetches its block's into L2 (bulk prefetches; the
// last phase's stages are in flight or in the ring by then).
template <class P>
KT_DEV void prefetch_first_stages(Ctx& c, const P& p) {
  const ItemMap map = loader_map(c, p);
  int n = 0;
  for (int it = int(blockIdx.x), nth = 0; it < map.items && n < STAGES; it += int(gridDim.x), ++nth) {
    if (it < map.rows) continue;
    const Item item = map.item(it, nth);
    for (int g = item.kc0 / STAGE_CHUNKS; g < item.kc1 / STAGE_CHUNKS && n < STAGES; ++g, ++n)
      if (feeds(c)) kt_prefetch_l2_bulk(c.a.scratch + stage_offset(p, item.tile, g), unsigned(sizeof(Stage)));
  }
}

#if KT_ATTN_SPARE
// KT_ATTN_FEED 1: the loader warpgroup's warps 1 and 2 issue the block's
// attention tiles by cp.async, from each M layer's q_abs phase on (once the
// consumers have issued q_abs's loads and so are done with the ring's
// memory, which the tiles take): tile k of the launch into slot k %
// AM_STAGES once the block has handed the slot back (att_empty). Each
// thread's arrival on att_full follows its copies (the mbarrier counts the
// 64 threads). The copies stall these warps, not the consumers (RESULTS,
// run 227: ~27 cp.async a consumer thread cost q_abs ~3 us).
KT_DEV void attention_spare_main(Ctx& c) {
  const unsigned u = unsigned(c.tid - THREADS - 32);  // 0 .. kSpareThreads - 1
  unsigned nth = 0;
  for (int layer = 0; layer < KT_LAYERS; ++layer) {
    if (!m_layer(layer)) continue;
    const KtMlaLayer& L = c.a.layers[layer].mla;
    loader_wait(&c.sm->qabs_layers, ++nth, 500);  // most of the launch: polls seldom
    const int rows = c.a.context + 1, nch = attn_chunks(rows), items = am_items(nch);
    AttMma& A = *reinterpret_cast<AttMma*>(c.sm->pipe);
    for (int it = blockIdx.x; it < items; it += gridDim.x) {
      const AmRows t = am_rows(it, rows, nch);
      for (int s = 0; s < t.ntiles; ++s) {
        const unsigned k = c.att_tiles++, slot = k % AM_STAGES;
        if (k >= unsigned(AM_STAGES)) kt_mbar_wait(&c.sm->att_empty[slot], (k / AM_STAGES - 1) & 1);
        for (int i = 0; i < 64 * KT_ATTN_LATE; ++i) __nanosleep(1000);
        issue_att_rows<kSpareThreads>(A.tile[slot], AttSrc{L.c_kv, L.k_rope}, t.r0 + s * AM_ROWS,
                                      imin(AM_ROWS, t.r1 - t.r0 - s * AM_ROWS), u);
        kt_cp_async_mbar_arrive(&c.sm->att_full[slot]);
        // KT_ATTN_FIRST: the item's first tile alone (AM_FIRST_ISSUED).
        if (KT_ATTN_FIRST && s == 0 && t.ntiles > 1) kt_mbar_wait(&c.sm->att_full[slot], (k / AM_STAGES) & 1);
      }
    }
  }
}
#endif

KT_DEV void loader_main(Ctx& c) {
  unsigned m_layers = 0;
  for (int layer = 0; layer < KT_LAYERS; ++layer) {
    const KtLayer& Ly = c.a.layers[layer];
    if (!m_layer(layer)) {
      load_phase(c, QkvgPhase{{layer_repack(layer)}, Ly.kda, layer});
      load_phase(c, make_oproj(c, layer, Ly.kda.o, C, nullptr));
    } else {
      load_phase(c, Mla1Phase{{layer_repack(layer)}, Ly.mla, c.a.context});
      load_phase(c, WuvPhase{{layer_repack(layer)}, Ly.mla, 0}, ++m_layers);
      load_phase(c, make_oproj(c, layer, Ly.mla.o, MO, nullptr));
    }
    load_moe(c, layer, Ly.moe);
  }
#if KT_LAUNCH_PREFETCH
  const KtLayer& L0 = c.a.layers[0];
  if (m_layer(0))
    prefetch_first_stages(c, Mla1Phase{{layer_repack(0)}, L0.mla, c.a.context});
  else
    prefetch_first_stages(c, QkvgPhase{{layer_repack(0)}, L0.kda, 0});
#endif
}
#endif

// KT_FEED 4: the attention is done with the ring's memory; the loader warp
// may fill it again.
KT_DEV void attention_done(Ctx& c) {
#if KT_FEED == 4
  kt_fence_proxy_async();  // this thread's accesses to the tiles before the loader's bulk copies
  kt_block_sync();
  signal_loader(c, &c.sm->attentions, c.sm->attentions + 1);
#else
  (void)c;
#endif
}

}  // namespace mk

#if KT_FEED >= 1
namespace mk {
// ---- the prepare table (KT_FEED > 0): the GEMV weights repacked into stages ----
// Stage `grp` of tile `tile` of one matrix (w_q [K/2, N] packed row pairs,
// scales and zeros [K/G, N]): chunk c's lane (g, t) gets 32 bytes, its first
// 16 at c * 1024 + lane * 16 and its second 512 bytes later (a warp's 16-byte
// loads each read 512 contiguous bytes); word j holds mma j's A register r as
// nibbles at bits 4r (k even) and 4r + 16 (k odd), for column 16 g + 2 j +
// (r & 1) and row pair 8 (8 grp + c) + t + 4 (r >> 1): the fragment that
// chunk_compute builds from the stored layout. Then the group's 128 scales
// and 128 (128 + zero)s, bf16. Columns past N (kv_a's last tile) get zero
// weights and scale 0, so they add nothing.
KT_DEV void repack_stage(const uint8_t* wq, const uint16_t* sc, const uint16_t* ze, int N, int tile, int grp,
                         uint8_t* out) {
  for (int i = threadIdx.x; i < STAGE_CHUNKS * 32; i += blockDim.x) {
    const int c = i / 32, lane = i % 32, g = lane >> 2, t = lane & 3;
    for (int j = 0; j < 8; ++j) {
      uint32_t word = 0;
      for (int r = 0; r < 4; ++r) {
        const int n = tile * TILE + 16 * g + 2 * j + (r & 1);
        const size_t kp = size_t(grp * STAGE_CHUNKS + c) * 8 + t + 4 * (r >> 1);
        const uint32_t byte = n < N ? wq[kp * size_t(N) + n] : 0u;
        word |= (byte & 15u) << (4 * r) | (byte >> 4) << (4 * r + 16);
      }
      *reinterpret_cast<uint32_t*>(out + c * 1024 + (j / 4) * 512 + lane * 16 + (j % 4) * 4) = word;
    }
  }
  Stage* st = reinterpret_cast<Stage*>(out);
  for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
    const int n = tile * TILE + i;
    const size_t so = size_t(grp) * N + n;
    st->sc[i] = n < N ? sc[so] : uint16_t(0);
    st->ze[i] = kt_f2bf(128.0f + (n < N ? kt_bf2f(ze[so]) : 0.0f));
  }
}

// One matrix to repack: its weights (expert e's slice of a stack), shape and
// place in the repacked copy (repack_layout).
struct RepackJob {
  const uint8_t* wq;
  const uint16_t *sc, *ze;
  int K, N;
  size_t dst;
};
constexpr int kAttnMatrices = 5, kMoeMatrices = 3 * (E + NSH);
// Layer l's m-th matrix in the repacked order; false for an m it lacks.
KT_DEV bool repack_job(const KimiDeviceArgs& a, int l, int m, RepackJob* j) {
  const KtLayer& Ly = a.layers[l];
  auto set = [&](const KtW4& w, int e, int K, int N, size_t dst) {
    *j = RepackJob{w.w_q + size_t(e) * (K / 2) * N, w.scales + size_t(e) * (K / G) * N,
                   w.zeros + size_t(e) * (K / G) * N, K, N, dst};
    return true;
  };
  const size_t base = layer_repack(l);
  if (m < kAttnMatrices) {
    if (!m_layer(l)) {
      const KtKdaLayer& L = Ly.kda;
      if (m < 4) return set(m == 0 ? L.q : m == 1 ? L.k : m == 2 ? L.v : L.g, 0, D, C, base + m * repack_bytes(D, C));
      return set(L.o, 0, C, D, base + 4 * repack_bytes(D, C));
    }
    const KtMlaLayer& L = Ly.mla;
    switch (m) {
      case 0: return set(L.q, 0, D, QDIM, base + kMlaQ);
      case 1: return set(L.kv_a, 0, D, KVA, base + kMlaKva);
      case 2: return set(L.kv_b, 0, R, KVB, base + kMlaKvb);
      case 3: return set(L.o, 0, MO, D, base + kMlaO);
      default: return false;
    }
  }
  m -= kAttnMatrices;
  if (m >= kMoeMatrices) return false;
  const KtMoeLayer& L = Ly.moe;
  const bool shared = m >= 3 * E;
  const int n = shared ? NSH : E, mm = shared ? m - 3 * E : m, which = mm / n, e = mm % n;
  const KtW4& w = which == 0 ? (shared ? L.s_gate : L.gate) : which == 1 ? (shared ? L.s_up : L.up)
                                                                        : (shared ? L.s_down : L.down);
  return set(w, e, which < 2 ? D : I, which < 2 ? I : D, moe_layer_repack(l) + moe_repack(shared, which, e));
}
}  // namespace mk

// ktune_k1, the prepare table's one launch: every stage of every matrix,
// one block per stage.
namespace mk {
#if KT_PREDICTED
// KT_PREDICT's tables (predictor_main), per layer and expert e, bf16:
// [0, K): M_e = Wo diag(w) R_e^T, o_proj's weights Wo (K x D, dequantized as
// the GEMVs do) times the MoE norm's weights w and router row R_e; then at
// max(C, MO), w R_e (D). A thread makes 8 rows of M_e: the 32 lanes of a
// warp read the same Wo bytes (broadcast) against 32 router rows.
KT_DEV void predict_tables(const KimiDeviceArgs& a) {
  constexpr int KO = PRED_K, RB = 8;
  static_assert(G % RB == 0 && C % RB == 0 && MO % RB == 0, "row blocks within a group");
  Scratch* s = reinterpret_cast<Scratch*>(a.scratch);
  const int per_layer = KO / RB * E;
  for (int u = int(blockIdx.x * blockDim.x + threadIdx.x); u < KT_LAYERS * per_layer;
       u += int(gridDim.x * blockDim.x)) {
    const int l = u / per_layer, e = u % E, k0 = u % per_layer / E * RB;
    const KtLayer& Ly = a.layers[l];
    const KtW4& wo = m_layer(l) ? Ly.mla.o : Ly.kda.o;
    if (k0 >= (m_layer(l) ? MO : C)) continue;
    const uint16_t* r = Ly.moe.router + size_t(e) * D;
    uint16_t* t = s->pred_table[l][e];
    float acc[RB] = {};
    for (int n = 0; n < D; ++n) {
      const float rw = kt_bf2f(Ly.moe_norm[n]) * kt_bf2f(r[n]);
      if (k0 == 0) t[KO + n] = kt_f2bf(rw);
      const size_t go = size_t(k0 / G) * D + n;
      const float sc = kt_bf2f(wo.scales[go]), ze = kt_bf2f(wo.zeros[go]);
#pragma unroll
      for (int j = 0; j < RB; j += 2) {
        const unsigned b = wo.w_q[size_t((k0 + j) / 2) * D + n];
        acc[j] += kt_round_bf16(kt_round_bf16(float(b & 15u) - ze) * sc) * rw;
        acc[j + 1] += kt_round_bf16(kt_round_bf16(float(b >> 4) - ze) * sc) * rw;
      }
    }
    for (int j = 0; j < RB; ++j) t[k0 + j] = kt_f2bf(acc[j]);
  }
}
#endif
}
#endif

#if KT_HAS_PREPARE
extern "C" __global__ void __launch_bounds__(mk::kPrepareThreads) ktune_k1(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs) {
  using namespace mk;
#if KT_FEED >= 1
  uint8_t* out = a.scratch + kRepackOffset;
  for (int l = 0; l < KT_LAYERS; ++l)
    for (int m = 0; m < kAttnMatrices + kMoeMatrices; ++m) {
      RepackJob j;
      if (!repack_job(a, l, m, &j)) continue;
      const int groups = j.K / G, stages = cdiv(j.N, TILE) * groups;
      for (int st = int(blockIdx.x); st < stages; st += int(gridDim.x)) {
        repack_stage(j.wq, j.sc, j.ze, j.N, st / groups, st % groups,
                     out + j.dst + repack_at(j.N, groups, st / groups, st % groups));
        __syncthreads();
      }
    }
#endif
#if KT_PREDICTED
  predict_tables(a);
#endif
#if KT_NUMBERING >= 2
  prepare_plans(a);
#endif
#if KT_GATHER_POLL
  unsigned* part = reinterpret_cast<unsigned*>(reinterpret_cast<Scratch*>(a.scratch)->partials);
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < kMaxItems * TILE; i += int(gridDim.x * blockDim.x))
    part[i] = kUnwritten;
#endif
}
#endif

namespace mk {
// The tables' entries and the scratch size, as constants: the ABI globals
// below and the PyTorch wrapper (export/kimi_ext.cu, which cannot read
// those globals from the host) both take them from here.
constexpr long long kScratchBytes =
    KT_FEED >= 1 ? (long long)(kRepackOffset + kRepackBytes) : (long long)sizeof(Scratch);  // and the repacked copy
constexpr KtLaunch kStepLaunch = {0, -KT_BLOCKS_PER_SM, KT_BLOCK_THREADS, int(sizeof(Smem)), 1, {{0, 0, 0, 0}}};
#if KT_HAS_PREPARE
constexpr KtLaunch kPrepareLaunch = {1, -kPrepareBlocksPerSm, kPrepareThreads, 0, 0, {{0, 0, 0, 0}}};
#endif
}  // namespace mk

// The ABI globals (abi.h). An extern "C" block, not `extern "C" T x = v;`:
// compiled for host and device together (a torch extension), the latter
// form leaves the host shadow of x undefined.
extern "C" {
__device__ int ktune_abi_version = KT_ABI_VERSION;
__device__ int ktune_config[KT_CONFIG_FIELDS] = {KT_D, KT_KH, KT_KD, KT_MH, KT_R, KT_NOPE, KT_ROPE, KT_VH,
                                                 KT_E, KT_TOPK, KT_NSH, KT_I, KT_G, KT_LAYERS, KT_PATTERN_M};
__device__ long long ktune_scratch_bytes = mk::kScratchBytes;
#if KT_HAS_PREPARE
__device__ int ktune_num_prepare = 1;
__device__ KtLaunch ktune_prepare[1] = {mk::kPrepareLaunch};
#endif
__device__ int ktune_num_launches = 1;
__device__ KtLaunch ktune_launches[1] = {mk::kStepLaunch};
}

extern "C" __global__ void __launch_bounds__(KT_BLOCK_THREADS, KT_BLOCKS_PER_SM)
    ktune_k0(const __grid_constant__ KimiDeviceArgs a, const KtLaunchArgs) {
  using namespace mk;
  Ctx c{a, reinterpret_cast<Scratch*>(a.scratch), reinterpret_cast<Smem*>(kt_smem()), int(threadIdx.x),
        int(threadIdx.x) & 31, int(threadIdx.x) >> 5};
  const int pos = a.context;
#if KT_FEED >= 1
  if (c.tid == 0) {
    for (int i = 0; i < STAGES; ++i) {
      kt_mbar_init(&c.sm->full[i], 1);  // thread 0's arrival with the copy's bytes
      kt_mbar_init(&c.sm->empty[i], FEED_WPG);  // the warps of the group that takes the stage
    }
#if KT_LIGHT_WARPS
    kt_mbar_init(&c.sm->light_go, 1);  // thread 0's post
    kt_mbar_init(&c.sm->light_done, kLightWarps);  // each light warp's, when its sums are in
#endif
#if KT_ATTN_SPARE
    for (int i = 0; i < AM_STAGES; ++i) {
      kt_mbar_init(&c.sm->att_full[i], kSpareThreads);  // each spare thread's, when its copies have landed
      kt_mbar_init(&c.sm->att_empty[i], 1);  // thread 0's, after the block's barrier
    }
    c.sm->qabs_layers = 0;
#endif
    kt_mbar_fence_init();
    c.sm->routed_layers = 0;
    c.sm->attentions = 0;
#if KT_HOLD_ON
    c.sm->gemv_started = 0;
#endif
#if KT_PREDICTED
    c.sm->o_layers = 0;
    c.sm->oproj_layers = 0;
#endif
  }
#if KT_NUMBERING >= 2
  load_plans(c);
#endif
  __syncthreads();  // the whole block, the loader warp too
#elif KT_NUMBERING >= 2
  load_plans(c);
  __syncthreads();
#endif
#if KT_FEED == 4
  // The loader warpgroup keeps kLoaderRegs registers a thread and lends the
  // rest to the consumers (setmaxnreg); one of its warps is the loader.
  if (c.tid >= THREADS) {
#if KT_LIGHT_WARPS
    if (c.tid >= THREADS + 128) {
      kt_setmaxnreg_dec<kLightRegs>();
      light_main(c.sm);
      return;
    }
#endif
    kt_setmaxnreg_dec<kLoaderRegs>();
    if (c.warp == WARPS) loader_main(c);
#if KT_ATTN_SPARE
    if (c.warp == WARPS + 1 || c.warp == WARPS + 2) attention_spare_main(c);
#endif
#if KT_PREDICTED
    if (c.warp > WARPS) predictor_main(c);
#endif
    return;
  }
  kt_setmaxnreg_inc<kConsumerRegs>();
#endif
#if KT_NUMBERING == 1
  make_plans(c);
  kt_block_sync();
#endif
#if KT_FLOW
  c.epoch = kt_ld_cg(&c.s->epoch);  // the last block out of the launch before counted it
#endif
#if KT_REDUCE == 1
  // The sums o_proj and down add into start at zero. Block 0's stores are
  // published by the first grid barrier; layer 0's o_proj comes after it.
  if (blockIdx.x == 0)
    for (int i = c.tid; i < KT_LAYERS * 2 * D; i += THREADS) (&c.s->carry[0][0][0])[i] = 0.0f;
#endif
  for (int layer = 0; layer < KT_LAYERS; ++layer) {
    const KtLayer& Ly = a.layers[layer];
    const uint16_t* x = layer == 0 ? a.x_in : c.s->xbuf[layer % 2];
    uint16_t* x_next = layer == KT_LAYERS - 1 ? a.x_out : c.s->xbuf[(layer + 1) % 2];
    uint16_t* x_carried = c.s->xbuf[layer % 2];  // KT_REDUCE 1: x, made from the last down phase's sums
#if KT_FLOW
    c.tag = flow_tag(c, layer);
#endif
    // The barrier after the previous layer's down phase, before this
    // layer's first GEMV (layer 0 starts the launch: no barrier; KT_FLOW 1:
    // none, the staging polls x's tagged words).
    if (((KT_PATTERN_M >> layer) & 1) == 0) {
      QkvgPhase first{{layer_repack(layer)}, Ly.kda, layer};
      layer > 0 ? barrier_before(c, first, !KT_FLOW_HX) : early_issue(c, first);
    } else {
      Mla1Phase first{{layer_repack(layer)}, Ly.mla, pos};
      layer > 0 ? barrier_before(c, first, !KT_FLOW_HX) : early_issue(c, first);
    }
    MoeAPhase next_moe{{moe_layer_repack(layer)}, Ly.moe, layer, moe_experts(c, layer)};
    if (!KT_FLOW) zero_spent_gu(c, layer);
    if (((KT_PATTERN_M >> layer) & 1) == 0) {
      const KtKdaLayer& L = Ly.kda;
      QkvgPhase qkvg{{layer_repack(layer)}, L, layer};
      OprojPhase oproj = make_oproj(c, layer, L.o, C, x);
      stamp(c, layer, 0);
      stage_layer_input(c, layer, x, Ly.attn_norm, x_carried);
      run_gemv_phase_before(c, qkvg, oproj);  // the KDA update between them leaves the ring alone
      const KdaState kda_first = int(blockIdx.x) < kda_items() ? kda_load(c, L, blockIdx.x) : KdaState{};
      if (KT_KDA_START == 0) barrier(c);
      if (KT_FLOW) zero_spent_gu(c, layer);
      stamp(c, layer, 1);
      kda_phase(c, L, layer, kda_first);
      oproj_phase(c, layer, oproj, C, c.s->kda_o, next_moe);
    } else {
      const KtMlaLayer& L = Ly.mla;
      Mla1Phase mla1{{layer_repack(layer)}, L, pos};
      stamp(c, layer, 0);
      stage_layer_input(c, layer, x, Ly.attn_norm, x_carried);
      run_gemv_phase(c, mla1);
      const QabsLoads qabs_first = int(blockIdx.x) < qabs_items() ? qabs_load(c, L, blockIdx.x) : QabsLoads{};
      barrier(c);
      if (KT_FLOW) zero_spent_gu(c, layer);
      stamp(c, layer, 1);
      qabs_phase(c, L, qabs_first, [&] {
#if KT_ATTN == 1 && KT_ATTN_EARLY
        attn_issue_first(c, L, pos);
#elif KT_ATTN_SPARE
        signal_loader(c, &c.sm->qabs_layers, c.sm->qabs_layers + 1);
#endif
      });
      barrier(c);
      stamp(c, layer, 2);
#if KT_ATTN == 1
      attn_phase_mma(c, L, pos);
#else
      attn_phase(c, L, pos);
#endif
      attention_done(c);
      WuvPhase wuv{{layer_repack(layer)}, L, attn_chunks(pos + 1)};
      OprojPhase oproj = make_oproj(c, layer, L.o, MO, x);
      barrier_before(c, wuv);
      stamp(c, layer, 3);
      run_gemv_phase_before(c, wuv, oproj);
      oproj_phase(c, layer, oproj, MO, c.s->mla_o, next_moe);
    }
    barrier_before(c, next_moe, !KT_FLOW_HX);
    moe_layer(c, layer, Ly, next_moe, x, x_next);
  }
  stamp(c, KT_LAYERS, 8);
  // The last block out resets the launch's counters for the next one.
  kt_block_sync();
#if KT_FEED == 4
  post_light(c, 0, -1);  // the light warps' last item is eaten: they leave
#endif
  if (c.tid == 0 && atomicAdd(&c.s->bar.exits, 1u) == gridDim.x - 1) {
    for (int l = 0; l < KT_LAYERS; ++l) atomicExch(&c.s->router_done[l], 0u);
#if KT_LOGITS == 1
    for (int l = 0; l < KT_LAYERS; ++l)
      for (int e = 0; e < E; ++e) c.s->logit_words[l][e] = 0;  // no block reads them any more
#endif
#if KT_PREDICTED
    for (int l = 0; l < KT_LAYERS; ++l)
      for (int e = 0; e < E; ++e)
        for (int p = 0; p < kPredParts; ++p) c.s->pred_words[l][e][p] = 0;  // likewise
#endif
#if KT_KDA_START == 1
    for (int l = 0; l < KT_LAYERS; ++l)
      for (int h = 0; h < KH; ++h) c.s->head_ready[l][h] = 0;  // no block reads them any more
#endif
#if KT_DOWN_START == 1
    for (int l = 0; l < KT_LAYERS; ++l)
      for (int t = 0; t < GU_SLOTS * 2 * (I / TILE); ++t) c.s->gu_ready[l][t] = 0;  // likewise
#endif
    for (int i = 0; i < kMaxGemvPhases; ++i) atomicExch(&c.s->next_item[i], 0u);
#if KT_FLOW
    atomicAdd(&c.s->epoch, 1u);  // the next launch's tags (flow_tag)
#endif
#if KT_BARRIER == 2
    atomicExch(&c.s->bar.count, 0u);
#endif
    atomicExch(&c.s->bar.exits, 0u);
  }
}

KT_KERNEL_TABLE_BEGIN
KT_KERNEL(ktune_k0)
#if KT_HAS_PREPARE
KT_KERNEL(ktune_k1)
#endif
KT_KERNEL_TABLE_END

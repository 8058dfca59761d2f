// Attention partials on tensor cores (KT_ATTN 1): the same items, chunks and
// outputs (attn_m, attn_l, attn_acc) as attn_phase, computed with m16n8k16
// bf16 mma. attn_phase is bound by its FMAs and warp shuffles (about 20
// times the time its cache reads take at 16384 rows); here a cached row
// costs about one mma per head. Included by megakernel.cu inside namespace
// mk; the shared-memory layout (AttMma) is there, for kPipeBytes.
//
// The block streams its chunk in tiles of AM_ROWS (16 or 32) rows, AM_STAGES
// deep (cp.async); a tile is AM_SUB steps of 16 rows in the mmas below, and
// the fixed costs of a tile (two block barriers, the exchange of partial
// scores) are paid once for all of them. Per tile, three steps:
//  1. scores S^T[h, t] (M = 16 heads, N = 8 rows, K = dims): warp w < AM_WD
//     takes latent dims [w AM_DW, (w + 1) AM_DW), warps 0..3 one 16-dim rope
//     step each; queries stay in registers as bf16 hi + lo fragments (two
//     mmas: 16 significant bits instead of bf16's 8; KT_ATTN_PARTS 1: the
//     hi part alone, one mma), B fragments come from the padded rows by
//     ldmatrix. Each warp writes its partial scores.
//  2. AM_ROWS threads per head sum the partials, update the head's running max
//     and sum, and write p = exp(s - m) (bf16 hi + lo again) and the head's
//     rescale factor exp(m_old - m) (KT_ATTN_PARTS 1: p as bf16 alone).
//  3. O[h, dims] = O * rescale + P[h, rows] c_kv[rows, dims] for the warp's
//     dims (M = 16 heads, K = 16 rows, N = 8 dims; B by ldmatrix.trans).
// Step 3 of tile s and step 1 of tile s + 1 run between the same two block
// barriers (independent mma chains, so they overlap), step 2 of tile s + 1
// after the second: two barriers per tile. Splitting the dims keeps O (16
// heads x AM_DW fp32) in registers, at the cost of step 2's exchange. An
// item takes AM_HP heads at a time (one or two m16 tiles, by registers);
// more make more passes over the chunk, as separate items. Heads past an
// item's are zero queries in the m16 tiles and are not written.

constexpr int AM_KS = AM_DW / 16;                       // latent 16-dim steps per warp
constexpr int AM_MT = AM_HP / 16;                       // m16 head tiles per pass
constexpr int AM_PASSES = (HG + AM_HP - 1) / AM_HP;     // passes over a chunk per item
constexpr int AM_RKS = ROPE / 16;                       // rope steps: warp w < AM_RKS takes step w
constexpr int AM_SUB = AM_ROWS / 16;                    // 16-row mma steps per tile
// KT_ATTN_ROLLED 1: the 16-row steps of a tile's scores and weighted sum
// as loops, not unrolled: ~40% less code a tile, as a third of the
// attention's stall samples wait for instructions (RESULTS, run 230).
constexpr int AM_SUB_UNROLL = KT_ATTN_ROLLED ? 1 : AM_SUB;
constexpr int AM_PAIRS = AM_HP * AM_ROWS;               // (head, row) pairs of a tile's softmax
constexpr int AM_SLOTS = (AM_PAIRS + THREADS - 1) / THREADS;
static_assert(AM_ROWS % 16 == 0 && AM_DW % 16 == 0 && AM_WD >= AM_RKS && AM_PAIRS % 32 == 0, "mma attention split");
// Tiles of an item issued before its first has landed: the ring's, or with
// KT_ATTN_FIRST 1 the first alone (the others follow once it has landed,
// in attn_phase_mma). Meant to let the first tile land sooner at long
// contexts; it did not (RESULTS, run 242: the rows come from DRAM there,
// and the other tiles were not what delayed it).
constexpr int AM_FIRST_ISSUED = KT_ATTN_FIRST ? 1 : AM_STAGES;

// A query fragment (16 heads x 16 dims) as bf16 hi + lo parts (KT_ATTN_PARTS
// 1: lo is never read, and the compiler drops it).
struct AmFrag {
  uint32_t hi[4], lo[4];
};
constexpr bool AM_LO = KT_ATTN_PARTS == 2;  // the queries' and probabilities' lo parts take part

// pair(h, d): the fp32 query values of pass-local head h at dims d, d + 1.
template <class Pair>
KT_DEV void load_query(AmFrag& f, int mt, int d0, int lane, Pair pair) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const float2 v = pair(16 * mt + g + (r & 1) * 8, d0 + 2 * t + (r >> 1) * 8);
    f.hi[r] = kt_pack(v.x, v.y);
    f.lo[r] = kt_pack(v.x - kt_lo(f.hi[r]), v.y - kt_hi(f.hi[r]));
  }
}

// s[mt][j] += Q[mt][ks] . rows 8 j .. 8 j + 7 over one 16-dim step, the
// queries' hi parts into s and their lo parts into s_lo (the same array, or
// with KT_ATTN_CHAINS 2 another: two mma chains half as long); `row` is this
// lane's ldmatrix address in the step (rows 0-7 | 8-15 x dims 0-7 | 8-15).
template <int N>
KT_DEV void am_score_step(const uint16_t* row, const AmFrag (&q)[AM_MT][N], int ks, float (&s)[AM_MT][2][4],
                          float (&s_lo)[AM_MT][2][4]) {
  uint32_t b[4];
  kt_ldmatrix_x4<false>(b, row);
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
  for (int mt = 0; mt < AM_MT; ++mt) {
    kt_mma_bf16(s[mt][0], q[mt][ks].hi, b0);
    kt_mma_bf16(s[mt][1], q[mt][ks].hi, b1);
    if (AM_LO) {
      kt_mma_bf16(s_lo[mt][0], q[mt][ks].lo, b0);
      kt_mma_bf16(s_lo[mt][1], q[mt][ks].lo, b1);
    }
  }
}

// Step 2's pair e: row e % AM_ROWS of a head. With 16 rows a half-warp per
// head, the two halves of a warp two heads apart (their partial-score reads
// then hit distinct banks); with 32 a warp per head.
KT_DEV int am_head(int e) {
  if (AM_ROWS == 32) return e >> 5;
  const int hq = e >> 4;
  return (hq & ~3) | ((hq & 1) << 1) | ((hq >> 1) & 1);
}

// Step 2 for this thread's pairs of tile rows [0, rows_here): m is their
// heads' running max; l the lane's share of the running sum (the 16 lanes
// of a head add theirs up when the item ends).
KT_DEV void am_softmax(Ctx& c, AttMma& A, int rows_here, float (&m)[AM_SLOTS], float (&l)[AM_SLOTS]) {
#pragma unroll
  for (int j = 0; j < AM_SLOTS; ++j) {
    const int e = j * THREADS + c.tid;
    if (AM_PAIRS % THREADS != 0 && e >= AM_PAIRS) break;  // whole warps (none when the pairs fill the slots)
    const int h = am_head(e), r = e & (AM_ROWS - 1);
    float s = 0;
#pragma unroll
    for (int w = 0; w < AM_WD; ++w) s += A.part[w][h][r];
    if (r >= rows_here) s = -INFINITY;
    float mx = s;
#pragma unroll
    for (int k = AM_ROWS / 2; k >= 1; k >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
    const float mn = fmaxf(m[j], mx), corr = expf(m[j] - mn), p = expf(s - mn);
    l[j] = l[j] * corr + p;
    m[j] = mn;
    const uint16_t hi = kt_f2bf(p);
    A.p[0][h][r] = hi;
    if (AM_LO) A.p[1][h][r] = kt_f2bf(p - kt_bf2f(hi));
    if (r == 0) A.corr[h] = corr;
  }
}

// This lane's ldmatrix row addresses: lane i gives row i % 8 of matrix
// i / 8. Scores' B: (rows 0-7 | 8-15) x (dims 0-7 | 8-15), dims first.
// P as A, and c_kv transposed as B: (heads or rows 0-7 | 8-15) first.
struct AmLanes {
  int srow, scol, prow, pcol;
  KT_DEV explicit AmLanes(int lane)
      : srow(((lane >> 4) << 3) + (lane & 7)),
        scol(((lane >> 3) & 1) << 3),
        prow((((lane >> 3) & 1) << 3) + (lane & 7)),
        pcol((lane >> 4) << 3) {}
};

// Step 1 for warp w < AM_WD: its partial scores of tile T into A.part[w].
KT_DEV void am_scores(const AttMmaTile& T, AttMma& A, int w, int lane, const AmLanes& al,
                      const AmFrag (&q)[AM_MT][AM_KS], const AmFrag (&qr)[AM_MT][1]) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll AM_SUB_UNROLL
  for (int sb = 0; sb < AM_SUB; ++sb) {  // rows 16 sb .. 16 sb + 15
    float sc[AM_MT][2][4] = {}, sc_lo[AM_MT][2][4] = {};
    float(&lo)[AM_MT][2][4] = KT_ATTN_CHAINS == 2 ? sc_lo : sc;
    const int row = 16 * sb + al.srow;
#pragma unroll
    for (int ks = 0; ks < AM_KS; ++ks) am_score_step(&T.c[row][w * AM_DW + 16 * ks + al.scol], q, ks, sc, lo);
    if (w < AM_RKS) am_score_step(&T.k[row][16 * w + al.scol], qr, 0, sc, lo);
    if (KT_ATTN_CHAINS == 2)
#pragma unroll
      for (int mt = 0; mt < AM_MT; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) sc[mt][j][i] += sc_lo[mt][j][i];
#pragma unroll
    for (int mt = 0; mt < AM_MT; ++mt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int r = 16 * sb + 8 * j + 2 * t;
        *reinterpret_cast<float2*>(&A.part[w][16 * mt + g][r]) = float2{sc[mt][j][0], sc[mt][j][1]};
        *reinterpret_cast<float2*>(&A.part[w][16 * mt + g + 8][r]) = float2{sc[mt][j][2], sc[mt][j][3]};
      }
  }
}

// Step 3 for warp w < AM_WD: o = o * rescale + P . T's rows, its dims.
KT_DEV void am_weighted_sum(const AttMmaTile& T, const AttMma& A, int w, int lane, const AmLanes& al,
                            float (&o)[AM_MT][AM_DW / 8][4]) {
  const int g = lane >> 2;
#pragma unroll
  for (int mt = 0; mt < AM_MT; ++mt) {
    const float c0 = A.corr[16 * mt + g], c1 = A.corr[16 * mt + g + 8];
#pragma unroll
    for (int n = 0; n < AM_DW / 8; ++n) {
      o[mt][n][0] *= c0;
      o[mt][n][1] *= c0;
      o[mt][n][2] *= c1;
      o[mt][n][3] *= c1;
    }
#pragma unroll AM_SUB_UNROLL
    for (int sb = 0; sb < AM_SUB; ++sb) {  // rows 16 sb .. 16 sb + 15 as the mma's k
      uint32_t ph[4], pl[4];
      kt_ldmatrix_x4<false>(ph, &A.p[0][16 * mt + al.prow][16 * sb + al.pcol]);
      if (AM_LO) kt_ldmatrix_x4<false>(pl, &A.p[1][16 * mt + al.prow][16 * sb + al.pcol]);
#pragma unroll
      for (int np = 0; np < AM_DW / 16; ++np) {
        uint32_t b[4];
        kt_ldmatrix_x4<true>(b, &T.c[16 * sb + al.prow][w * AM_DW + 16 * np + al.pcol]);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        kt_mma_bf16(o[mt][2 * np], ph, b0);
        kt_mma_bf16(o[mt][2 * np + 1], ph, b1);
        if (AM_LO) {
          kt_mma_bf16(o[mt][2 * np], pl, b0);
          kt_mma_bf16(o[mt][2 * np + 1], pl, b1);
        }
      }
    }
  }
}

// The cached rows [r0, r1) of item it's chunk, and its tiles.
struct AmRows {
  int r0, r1, ntiles;
};
KT_DEV AmRows am_rows(int it, int rows, int nch) {
  const int ch = it / AM_PASSES % nch;
  const int r0 = int(size_t(ch) * rows / nch), r1 = int(size_t(ch + 1) * rows / nch);
  return {r0, r1, (r1 - r0 + AM_ROWS - 1) / AM_ROWS};
}
// The attention's items: chunks x head groups x passes of AM_HP heads.
KT_DEV int am_items(int nch) { return (MH / HG) * nch * AM_PASSES; }
// Tile s of those rows into its ring slot (none past the last), one cp.async group either way.
KT_DEV void am_issue(Ctx& c, AttMma& A, const AttSrc& src, const AmRows& t, int s) {
  if (s < t.ntiles) issue_att_tile(c, A.tile[s % AM_STAGES], src, t.r0 + s * AM_ROWS, imin(AM_ROWS, t.r1 - t.r0 - s * AM_ROWS));
  kt_cp_async_commit();
}

// KT_ATTN_EARLY 1: the block's first item's first AM_STAGES tiles, issued
// in the q_abs phase (behind its own loads: issued before them, the ~110
// KB a block delayed q_abs as much as they saved, RESULTS run 226) instead
// of after the barrier that ends it. Every cached row is written by then
// (the new one by q,kv_a's epilogue, before the barrier that precedes
// q_abs), and q_abs leaves shared memory and cp.async alone; the loader
// refills the ring only after the attention (attention_done). At 8192 rows
// and more every block issues three 32-row tiles at once (~15 MB over the
// grid), and the attention's start waited ~3.5 us for its first tile
// behind them (run 226).
KT_DEV void attn_issue_first(Ctx& c, const KtMlaLayer& L, int pos) {
  const int rows = pos + 1, nch = attn_chunks(rows), items = am_items(nch);
  if (int(blockIdx.x) >= items) return;
  AttMma& A = *reinterpret_cast<AttMma*>(c.sm->pipe);
  const AmRows t = am_rows(blockIdx.x, rows, nch);
  for (int s = 0; s < AM_FIRST_ISSUED; ++s) am_issue(c, A, AttSrc{L.c_kv, L.k_rope}, t, s);
}

KT_DEV void attn_phase_mma(Ctx& c, const KtMlaLayer& L, int pos) {
  const int rows = pos + 1, nch = attn_chunks(rows), items = am_items(nch);
  const int lane = c.lane, w = c.warp;
  // This warp takes latent dims [w AM_DW, (w + 1) AM_DW); a constant when every warp does.
  const bool dims = AM_WD == WARPS || w < AM_WD;
  const AmLanes al(lane);
  AttMma& A = *reinterpret_cast<AttMma*>(c.sm->pipe);
  const AttSrc src{L.c_kv, L.k_rope};
  for (int it = blockIdx.x; it < items; it += gridDim.x) {
    const int ps = it % AM_PASSES, hg = it / AM_PASSES / nch, ch = it / AM_PASSES % nch;
    const int h0 = hg * HG + ps * AM_HP, nh = imin(AM_HP, HG - ps * AM_HP);
    const AmRows t = am_rows(it, rows, nch);
    const int r0 = t.r0, r1 = t.r1, ntiles = t.ntiles;
    // KT_ATTN_FEED 0: the block's threads issue the tiles (cp.async groups;
    // KT_ATTN_EARLY 1: attn_issue_first issued the block's first). 1: the
    // spare warps issue them (attention_spare_main), tile k of the launch
    // into slot k % AM_STAGES, and the block waits for each on the slot's
    // full mbarrier and hands the slot back on its empty one.
    const unsigned k0 = c.att_tiles;
    c.att_tiles += unsigned(ntiles);
    auto slot = [&](int s) { return KT_ATTN_SPARE ? int((k0 + unsigned(s)) % AM_STAGES) : s % AM_STAGES; };
    auto issue = [&](int s) {
      if (!KT_ATTN_SPARE) am_issue(c, A, src, t, s);
    };
    auto await = [&](int s) {  // tile s has landed (KT_ATTN_FEED 1; KT_ATTN_FEED 0 waits for its cp.async groups)
#if KT_ATTN_SPARE
      if (s < ntiles) kt_mbar_wait(&c.sm->att_full[slot(s)], ((k0 + unsigned(s)) / AM_STAGES) & 1);
#else
      (void)s;
#endif
    };
    auto release = [&](int s) {  // after a block barrier: every warp is done with tile s
#if KT_ATTN_SPARE
      if (c.tid == 0) kt_mbar_arrive(&c.sm->att_empty[slot(s)]);
#else
      (void)s;
#endif
    };
    if (!KT_ATTN_EARLY || it != int(blockIdx.x))
      for (int s = 0; s < AM_FIRST_ISSUED; ++s) issue(s);
    AmFrag q[AM_MT][AM_KS], qr[AM_MT][1];
    float o[AM_MT][AM_DW / 8][4] = {}, m[AM_SLOTS], l[AM_SLOTS];
    if (dims) {
#pragma unroll
      for (int mt = 0; mt < AM_MT; ++mt) {
#pragma unroll
        for (int ks = 0; ks < AM_KS; ++ks)
          load_query(q[mt][ks], mt, w * AM_DW + 16 * ks, lane, [&](int h, int d) {
            return h < nh ? kt_ld_cg(reinterpret_cast<const float2*>(&c.s->q_abs[(h0 + h) * R + d])) : float2{0, 0};
          });
        if (w < AM_RKS)
          load_query(qr[mt][0], mt, 16 * w, lane, [&](int h, int d) {
            if (h >= nh) return float2{0, 0};
            const uint16_t* p = &c.s->mla_q[(h0 + h) * QH + NOPE + d];
            return float2{kt_bf2f(kt_ld_cg(p)) * kQkScale, kt_bf2f(kt_ld_cg(p + 1)) * kQkScale};
          });
      }
    }
#pragma unroll
    for (int j = 0; j < AM_SLOTS; ++j) {
      m[j] = -INFINITY;
      l[j] = 0;
    }
    // Tile 0's scores and softmax; then per tile s, after one barrier, the
    // weighted sum of tile s and the scores of tile s + 1 (independent mma
    // chains, so they overlap), and after a second one tile s + 1's softmax.
    if (KT_ATTN_FIRST && !KT_ATTN_SPARE) {  // the ring's other tiles (AM_FIRST_ISSUED)
      kt_cp_async_wait<0>();
      for (int s = 1; s < AM_STAGES; ++s) issue(s);
    }
    kt_cp_async_wait<AM_STAGES - 1>();
    await(0);
    kt_block_sync();
    if (dims) am_scores(A.tile[slot(0)], A, w, lane, al, q, qr);
    kt_block_sync();
    am_softmax(c, A, imin(AM_ROWS, r1 - r0), m, l);
    for (int s = 0; s < ntiles; ++s) {
      stamp(c, c.layer, kPointTileWait, true);
      kt_cp_async_wait<AM_STAGES - 2>();
      await(s + 1);
      kt_block_sync();  // tile s + 1 is in, tile s's probabilities are out
      stamp(c, c.layer, kPointTileMma, true);
      if (dims) {
        am_weighted_sum(A.tile[slot(s)], A, w, lane, al, o);
        if (s + 1 < ntiles) am_scores(A.tile[slot(s + 1)], A, w, lane, al, q, qr);
      }
      stamp(c, c.layer, kPointTileSoftmax, true);
      kt_block_sync();  // tile s is used up, tile s + 1's partial scores are in
      release(s);
      issue(s + AM_STAGES);
      if (s + 1 < ntiles) am_softmax(c, A, imin(AM_ROWS, r1 - r0 - (s + 1) * AM_ROWS), m, l);
    }
#pragma unroll
    for (int j = 0; j < AM_SLOTS; ++j) {
      const int e = j * THREADS + c.tid, h = am_head(e);
      if (AM_PAIRS % THREADS != 0 && e >= AM_PAIRS) break;  // whole warps
#pragma unroll
      for (int k = AM_ROWS / 2; k >= 1; k >>= 1) l[j] += __shfl_xor_sync(0xffffffffu, l[j], k);
      if ((e & (AM_ROWS - 1)) == 0 && h < nh) {
        c.s->attn_m[ch * MH + h0 + h] = m[j];
        c.s->attn_l[ch * MH + h0 + h] = l[j];
      }
    }
    if (dims) {
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int mt = 0; mt < AM_MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int h = 16 * mt + g + 8 * hh;
          if (h >= nh) continue;
          float* out = &c.s->attn_acc[size_t(ch * MH + h0 + h) * R + w * AM_DW + 2 * t];
#pragma unroll
          for (int n = 0; n < AM_DW / 8; ++n)
            *reinterpret_cast<float2*>(out + 8 * n) = float2{o[mt][n][2 * hh], o[mt][n][2 * hh + 1]};
        }
    }
  }
  kt_cp_async_wait<0>();  // the last items' empty groups
  kt_block_sync();        // the next phase may reuse the pipe
}

// Seeded states: SeededStates hands out a longer context's state cut down
// to a shorter one, and that must be the state make_state makes, bit for
// bit, whatever the order of the requests and however many seeds come
// between them.
#include <doctest/doctest.h>

#include <string>

#include "kernels/kimi/state.h"

using namespace ktune::kimi;

namespace {

KimiConfig tiny() {
  KimiConfig cfg;
  std::string err;
  REQUIRE_MESSAGE(KimiConfig::preset("tiny", &cfg, &err), err);
  return cfg;
}

// Every vector of every layer, and the context, the same.
void check_same(const KimiConfig& cfg, const KimiState& got, const KimiState& want) {
  REQUIRE(got.layers.size() == want.layers.size());
  CHECK(got.context == want.context);
  for (int i = 0; i < cfg.layers(); ++i) {
    INFO("layer " << i);
    const LayerState &g = got.layers[i], &w = want.layers[i];
    CHECK(g.S == w.S);
    CHECK(g.cq == w.cq);
    CHECK(g.ck == w.ck);
    CHECK(g.cv == w.cv);
    CHECK(g.c_kv.size() == w.c_kv.size());
    CHECK(g.c_kv == w.c_kv);
    CHECK(g.k_rope == w.k_rope);
  }
}

}  // namespace

TEST_CASE("a seed's state cut from a longer context's is make_state's, in any order of requests") {
  const KimiConfig cfg = tiny();
  const int capacity = 200;
  SeededStates states(cfg, capacity);
  struct Ask {
    uint64_t seed;
    int context, longest;
  };
  // Longest first, then shorter (copies); a longer one than kept
  // (generated again); seeds in between past what is kept (regenerated);
  // and context 0 (no rows at all).
  const Ask asks[] = {{7, 130, 130}, {7, 5, 130},  {7, 0, 0},    {7, 150, 0}, {8, 60, 130}, {9, 20, 0},
                      {10, 20, 0},   {11, 20, 0},  {12, 20, 0},  {7, 130, 0}, {8, 130, 0},  {7, 1, 150}};
  for (const Ask& a : asks) {
    INFO("seed " << a.seed << ", context " << a.context << ", longest " << a.longest);
    check_same(cfg, states.get(a.seed, a.context, a.longest), make_state(cfg, a.seed, a.context, capacity));
  }

  // The cut really zeroes the rows past the context: the longer state has
  // values there, the shorter one none.
  const KimiState longer = states.get(7, 130), shorter = states.get(7, 5);
  int m = 0;
  while (cfg.is_kda(m)) ++m;
  const size_t past = size_t(5) * cfg.kv_lora;
  bool longer_has_rows = false, shorter_has_rows = false;
  for (size_t j = past; j < size_t(130) * cfg.kv_lora; ++j) {
    longer_has_rows |= longer.layers[m].c_kv[j] != 0;
    shorter_has_rows |= shorter.layers[m].c_kv[j] != 0;
  }
  CHECK(longer_has_rows);
  CHECK_FALSE(shorter_has_rows);

  // With no capacity, a state has room for context + 1 rows, as make_state's.
  SeededStates unsized(cfg, 0);
  check_same(cfg, unsized.get(3, 100, 130), make_state(cfg, 3, 100));
  check_same(cfg, unsized.get(3, 4), make_state(cfg, 3, 4));
}

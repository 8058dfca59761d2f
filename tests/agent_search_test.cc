// Tests of the search designer on the host megakernel's real knob space,
// with contexts written here: its first proposals, and what it takes from
// earlier sessions (starting points, failed values, measured points). The
// whole loop, through `ktune run` on one database, is in agent_session_test.
#include <doctest/doctest.h>

#include <set>

#include "agent/designers.h"
#include "tests/agent_fixture.h"

using namespace ktune;
using namespace ktune::agent;
using ktune::agent::testing::host_design_context;

namespace {

// The host template's context, with a fixed seed for the search.
DesignContext host_context() {
  DesignContext ctx = host_design_context();
  ctx.seed = 7;
  return ctx;
}

// An attempt at `knobs` whose score follows from its speedup.
AttemptView attempt(const DesignContext& ctx, const json& knobs, const std::string& outcome, double speedup) {
  return testing::attempt_at(ctx, knobs, outcome, speedup > 0 ? 1000.0 / speedup : 0, speedup);
}

std::vector<Proposal> propose(DesignContext& ctx, int max) {
  auto designer = make_search_designer();
  std::vector<Proposal> out;
  std::string err;
  REQUIRE_MESSAGE(designer->propose(ctx, max, &out, &err), err);
  return out;
}

}  // namespace

TEST_CASE("search: a first session starts from the defaults, then moves one knob or draws a point") {
  DesignContext ctx = host_context();
  const auto out = propose(ctx, 8);
  REQUIRE(out.size() == 8);
  CHECK(out[0].knobs == ctx.megakernel->space.defaults());
  CHECK(out[0].rationale.rfind("the template's default knobs", 0) == 0);
  std::set<std::string> ids;
  for (const Proposal& p : out) {
    CHECK(ids.insert(ctx.variant_id(p.knobs, "")).second);  // no point twice
    const bool neighbour = p.rationale.rfind("neighbour of the defaults: ", 0) == 0;
    const bool random = p.rationale.rfind("exploration: ", 0) == 0;
    CHECK((&p == &out[0] || neighbour || random));
  }
}

TEST_CASE("search: a later session measures the defaults and the earlier fastest point again, nothing else measured") {
  DesignContext ctx = host_context();
  const variants::KnobSpace& space = ctx.megakernel->space;
  const AttemptView defaults = attempt(ctx, space.defaults(), "ok", 10.0);
  const AttemptView fastest = attempt(ctx, {{"threads", 8}, {"tile", 128}}, "ok", 25.0);
  const AttemptView slower = attempt(ctx, {{"threads", 4}}, "ok", 12.0);
  ctx.earlier = {defaults, slower, fastest};
  for (const AttemptView& a : ctx.earlier) ctx.measured.insert(a.variant);

  const auto out = propose(ctx, 10);
  REQUIRE(out.size() == 10);
  CHECK(ctx.variant_id(out[0].knobs, "") == defaults.variant);
  CHECK(ctx.variant_id(out[1].knobs, "") == fastest.variant);
  CHECK(out[1].rationale == "the fastest point of earlier sessions on this code (40.0 us, 25.00x their baseline), "
                            "measured again as a start");
  CHECK(out[1].parent.empty());
  for (size_t i = 2; i < out.size(); ++i) CHECK_FALSE(ctx.measured.count(ctx.variant_id(out[i].knobs, "")));

  SUBCASE("proposed and still queued, neither is proposed again by the next design step") {
    // On a GPU the next batch is designed while this one is measured: the
    // session counts the queued ids as measured, and the history is empty.
    auto designer = make_search_designer();
    std::vector<Proposal> first, second;
    std::string err;
    REQUIRE(designer->propose(ctx, 4, &first, &err));
    REQUIRE(first.size() == 4);
    for (const Proposal& p : first) ctx.measured.insert(ctx.variant_id(p.knobs, ""));
    REQUIRE(designer->propose(ctx, 4, &second, &err));
    CHECK(second.size() == 4);  // a full batch of new points
    for (const Proposal& p : second) CHECK_FALSE(ctx.measured.count(ctx.variant_id(p.knobs, "")));
  }

  SUBCASE("once measured in this session, neither is proposed again") {
    AttemptView here_defaults = defaults, here_fastest = fastest;
    here_defaults.seq = 2;
    here_fastest.seq = 3;
    ctx.history = {here_defaults, here_fastest};
    ctx.best = &ctx.history[1];
    const auto next = propose(ctx, 10);
    REQUIRE_FALSE(next.empty());
    for (const Proposal& p : next) {
      const std::string id = ctx.variant_id(p.knobs, "");
      CHECK(id != defaults.variant);
      CHECK(id != fastest.variant);
      CHECK_FALSE(ctx.measured.count(id));
    }
    // Neighbours are now of this session's best, the point started from.
    int of_best = 0;
    for (const Proposal& p : next) of_best += p.rationale.rfind("neighbour of the best: ", 0) == 0;
    CHECK(of_best >= 1);
  }
}

TEST_CASE("search: a knob value that failed twice in earlier sessions, never ok, is not proposed") {
  DesignContext ctx = host_context();
  // tile 256 failed twice; tile 16 failed once and once did fine.
  ctx.earlier = {attempt(ctx, {{"tile", 256}}, "wrong_answer", 0), attempt(ctx, {{"tile", 256}, {"threads", 4}}, "timeout", 0),
                 attempt(ctx, {{"tile", 16}}, "compile_error", 0), attempt(ctx, {{"tile", 16}, {"unroll", 4}}, "ok", 3.0)};
  for (const AttemptView& a : ctx.earlier) ctx.measured.insert(a.variant);
  int tile16 = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    ctx.seed = seed;
    for (const Proposal& p : propose(ctx, 12)) {
      CHECK(p.knobs["tile"] != 256);
      tile16 += p.knobs["tile"] == 16;
    }
  }
  CHECK(tile16 > 0);  // a value that worked once stays in play

  // The same failures with no earlier session: tile 256 is proposed.
  ctx.earlier.clear();
  ctx.measured.clear();
  int tile256 = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    ctx.seed = seed;
    for (const Proposal& p : propose(ctx, 12)) tile256 += p.knobs["tile"] == 256;
  }
  CHECK(tile256 > 0);
}

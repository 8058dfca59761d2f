// Shared by the designer tests: a design context for the host megakernel's
// real knob space and embedded source, with no attempts in it yet, and
// attempts to put in it. A point's
// id is a hash of its complete knobs and source, as the session's rendering
// makes one id per point.
#pragma once
#include <doctest/doctest.h>

#include "agent/designer.h"
#include "base/sha256.h"
#include "kernels/kimi/templates.h"
#include "variants/templates.h"

namespace ktune::agent::testing {

inline DesignContext host_design_context() {
  DesignContext ctx;
  ctx.task = "kimi-linear";
  ctx.size = "small";
  ctx.backend = "host";
  ctx.megakernel = kimi::megakernel_template("host");
  REQUIRE(ctx.megakernel);
  ctx.megakernel_source = *variants::embedded_file(ctx.megakernel->file);
  ctx.budget_left_s = 60;
  const variants::KnobSpace* space = &ctx.megakernel->space;
  ctx.variant_id = [space](const json& knobs, const std::string& source) {
    return sha256_hex(space->complete(knobs).dump() + source);
  };
  return ctx;
}

// An attempt at the point `knobs` (completed with the defaults) as a
// session would have recorded it; the error is for failed outcomes.
inline AttemptView attempt_at(const DesignContext& ctx, const json& knobs, const std::string& outcome, double score_us,
                              double speedup, const std::string& error = "") {
  AttemptView a;
  a.template_name = ctx.megakernel->name;
  a.knobs = ctx.megakernel->space.complete(knobs);
  a.variant = ctx.variant_id(a.knobs, "");
  a.outcome = outcome;
  a.score_us = score_us;
  a.speedup = speedup;
  a.error = error;
  return a;
}

}  // namespace ktune::agent::testing

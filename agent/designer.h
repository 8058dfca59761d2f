// Designers propose the next variants of a session. The search designer
// explores a template's knob space; the LLM designer asks a language model;
// the replay designer feeds back the proposals of a recorded session. They
// see the same context (task, hardware facts, history) and answer with
// proposals; the session renders, builds and measures them. A designer
// never runs anything itself.
#pragma once
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/json.h"
#include "variants/templates.h"

namespace ktune::agent {

// One attempt of the session, as designers see it.
struct AttemptView {
  int seq = 0;
  std::string variant, template_name, origin, parent;
  json knobs = json::object();
  std::string outcome, decision, reason, error;
  double score_us = 0;  // 0 when not measured
  double speedup = 0;   // baseline / score
};

struct DesignContext {
  std::string task, size, backend;
  const variants::Template* megakernel = nullptr;  // the template whose knobs are explored
  std::string megakernel_source;                    // its embedded text (for designers that rewrite it)
  json facts = json::object();     // device facts
  json probes = json::array();     // measured hardware numbers and floors
  std::vector<AttemptView> history;
  // Judged attempts of earlier sessions on the same task, backend, size and
  // device whose knobs render to the same code today (so what they showed
  // still holds): megakernel points only, oldest first.
  std::vector<AttemptView> earlier;
  std::set<std::string> measured;  // variant ids already measured (this session and earlier ones on this device)
  const AttemptView* best = nullptr;
  double baseline_us = 0;
  double budget_left_s = 0;
  uint64_t seed = 0;
  // The id a knob point of the megakernel template renders to, with the
  // template's text or, when `source` is non-empty, with that text instead
  // (for skipping measured variants before proposing them); empty when it
  // does not render.
  std::function<std::string(const json& knobs, const std::string& source)> variant_id;
  // Records an event of the designer's own in the session (e.g. "llm_call",
  // see traces/events.h); the session stores it as it happens.
  std::function<void(const std::string& kind, const json& data)> record;
  // The attempt number the next proposal will get (for linking records).
  int next_attempt = 0;
};

struct Proposal {
  std::string template_name;  // empty: the megakernel template
  json knobs = json::object();
  std::string source;         // non-empty: a whole source replacing the template's text
  std::string rendered;       // non-empty: the complete translation unit, used verbatim (replays)
  std::string origin;         // "search", "llm", "replay", ...
  std::string rationale;
  std::string parent;         // the variant id it was derived from; empty: the session's best when it is built
};

class Designer {
 public:
  virtual ~Designer() = default;
  virtual std::string name() const = 0;
  // Up to `max` new proposals; none when the designer has nothing left. A
  // false return is a designer failure the session records and survives.
  virtual bool propose(const DesignContext& ctx, int max, std::vector<Proposal>* out, std::string* err) = 0;
  // Totals for the summary (LLM tokens and calls, ...).
  virtual json usage() const { return json::object(); }
};

// The knob-space search: defaults first, then neighbours of the best and
// seeded random points, steered away from knob values that failed.
std::unique_ptr<Designer> make_search_designer();

}  // namespace ktune::agent

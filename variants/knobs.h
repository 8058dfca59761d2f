// Knob spaces: the design levers of a kernel template, each a named list of
// allowed values with a default, plus the constraints that tie knobs
// together. A variant of a template is a point in its space; designers
// explore the space, the renderer turns a point into source.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "base/json.h"

namespace ktune::variants {

struct Knob {
  std::string name;          // e.g. "threads"
  std::string macro;         // the #define the template reads, e.g. "KT_THREADS"
  std::vector<json> values;  // allowed values, in a meaningful order (small to large);
                             // numbers render as themselves, strings (enumerations)
                             // as their position in this list, so `#if KT_X == 1` works
  json default_value;
  std::string help;          // what the lever does, for users and the LLM designer
  // Whether the knob changes the kernel at a point (empty: everywhere). At a
  // point where it does not, the knob is inert (e.g. the register path's
  // loop knobs once the weights go through shared memory).
  std::function<bool(const json& point)> active = nullptr;
};

struct KnobSpace {
  std::vector<Knob> knobs;
  // Cross-knob rules: returns false with the reason when a point is invalid.
  std::function<bool(const json& point, std::string* why)> constraint;

  const Knob* find(const std::string& name) const;
  json defaults() const;
  // Every knob present with an allowed value, no unknown knobs, and the
  // constraint holds.
  bool valid(const json& point, std::string* why) const;
  // Fills missing knobs with their defaults (no validation).
  json complete(const json& point) const;
  // The point (complete: see complete()) with every inert knob at its
  // default, so points that differ only in knobs that change nothing are
  // one variant (one id, one build, one measurement). An incomplete point,
  // or one the constraint would then refuse, comes back as it was.
  json canonical(const json& point) const;
  // The knobs inert at a point that are not at their defaults there.
  std::vector<std::string> inert_moved(const json& point) const;
  // The number of points before constraints.
  double size() const;
  json describe() const;  // [{name, values, default, help}] for prompts and `ktune show`
};

}  // namespace ktune::variants

#include "variants/knobs.h"

namespace ktune::variants {

const Knob* KnobSpace::find(const std::string& name) const {
  for (const Knob& k : knobs)
    if (k.name == name) return &k;
  return nullptr;
}

json KnobSpace::defaults() const {
  json out = json::object();
  for (const Knob& k : knobs) out[k.name] = k.default_value;
  return out;
}

json KnobSpace::complete(const json& point) const {
  json out = defaults();
  if (point.is_object())
    for (auto& [name, v] : point.items()) out[name] = v;
  return out;
}

json KnobSpace::canonical(const json& point) const {
  if (!point.is_object()) return point;
  for (const Knob& k : knobs)
    if (!point.contains(k.name)) return point;  // the predicates read complete points
  json out = point;
  // An inert knob set to its default can make another knob active or
  // inert, so repeat until nothing moves (at most once per knob).
  for (size_t round = 0; round <= knobs.size(); ++round) {
    bool moved = false;
    for (const Knob& k : knobs)
      if (k.active && out[k.name] != k.default_value && !k.active(out)) {
        out[k.name] = k.default_value;
        moved = true;
      }
    if (!moved) break;
  }
  std::string why;
  return valid(out, &why) ? out : point;
}

std::vector<std::string> KnobSpace::inert_moved(const json& point) const {
  std::vector<std::string> out;
  const json c = canonical(point);
  if (c == point) return out;  // nothing moved (or not a complete, valid point)
  for (const Knob& k : knobs)
    if (point[k.name] != c[k.name]) out.push_back(k.name);
  return out;
}

bool KnobSpace::valid(const json& point, std::string* why) const {
  if (!point.is_object()) {
    *why = "knobs must be a JSON object";
    return false;
  }
  for (auto& [name, v] : point.items())
    if (!find(name)) {
      *why = "unknown knob '" + name + "'";
      return false;
    }
  for (const Knob& k : knobs) {
    if (!point.contains(k.name)) {
      *why = "knob '" + k.name + "' is missing";
      return false;
    }
    bool allowed = false;
    for (const json& v : k.values) allowed = allowed || v == point[k.name];
    if (!allowed) {
      *why = "knob '" + k.name + "' = " + point[k.name].dump() + " is not one of " + json(k.values).dump();
      return false;
    }
  }
  return !constraint || constraint(point, why);
}

double KnobSpace::size() const {
  double n = 1;
  for (const Knob& k : knobs) n *= double(k.values.size());
  return n;
}

json KnobSpace::describe() const {
  json out = json::array();
  for (const Knob& k : knobs)
    out.push_back({{"name", k.name}, {"values", k.values}, {"default", k.default_value}, {"help", k.help}});
  return out;
}

}  // namespace ktune::variants

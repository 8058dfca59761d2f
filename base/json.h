// The one JSON type used across ktune (nlohmann::json, keys sorted, so the
// text of a knob set, and therefore its hash, does not depend on insertion
// order).
#pragma once
#include <nlohmann/json.hpp>

namespace ktune {
using json = nlohmann::json;
}

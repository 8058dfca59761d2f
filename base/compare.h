// Similarity of an output to its reference: cosine and relative L2 error,
// computed in double, plus the count of non-finite values. Validation and the
// golden checks gate on these.
#pragma once
#include <cmath>
#include <cstddef>
#include <string>

#include "base/json.h"

namespace ktune {

struct Similarity {
  double cosine = 0;
  double rel_l2 = 0;
  size_t nonfinite = 0;  // NaN or Inf in the candidate
  size_t n = 0;

  json to_json() const { return {{"cosine", cosine}, {"rel_l2", rel_l2}, {"nonfinite", nonfinite}, {"n", n}}; }
};

// `get(i)` returns element i of (candidate, reference) as a pair of doubles.
template <class Get>
Similarity similarity(size_t n, Get get) {
  Similarity s;
  s.n = n;
  double dot = 0, na = 0, nb = 0, diff = 0;
  for (size_t i = 0; i < n; ++i) {
    auto [a, b] = get(i);
    if (!std::isfinite(a)) {
      ++s.nonfinite;
      continue;
    }
    dot += a * b;
    na += a * a;
    nb += b * b;
    diff += (a - b) * (a - b);
  }
  if (na == 0 && nb == 0) {
    s.cosine = 1;
    s.rel_l2 = 0;
  } else {
    s.cosine = (na > 0 && nb > 0) ? dot / std::sqrt(na * nb) : 0;
    s.rel_l2 = nb > 0 ? std::sqrt(diff / nb) : INFINITY;
  }
  if (s.nonfinite) s.cosine = 0;
  return s;
}

}  // namespace ktune

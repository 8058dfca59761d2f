// The timing statistics and the keep-or-roll-back comparison (measure/stats.h):
// medians and spreads of samples, a score over contexts, and a verdict that
// calls a candidate faster only beyond both the minimum gain and 3x the
// measured noise.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "measure/stats.h"

using namespace ktune::measure;

TEST_CASE("samples summarize to their median, quantiles and median absolute deviation, in any order") {
  const SampleStats s = summarize({12, 10, 11, 100, 9});  // one outlier
  CHECK(s.n == 5);
  CHECK(s.median == doctest::Approx(11));
  CHECK(s.min == doctest::Approx(9));
  CHECK(s.max == doctest::Approx(100));
  CHECK(s.mean == doctest::Approx(28.4));
  // Deviations from 11: 1, 1, 0, 89, 2 -> median 1; the outlier moves neither.
  CHECK(s.mad == doctest::Approx(1));
  // Quantiles interpolate between the sorted samples 9 10 11 12 100.
  CHECK(s.p10 == doctest::Approx(9.4));
  CHECK(s.p90 == doctest::Approx(64.8));
  CHECK(s.rel_se() == doctest::Approx(1.2533 * 1.4826 * 1 / std::sqrt(5.0) / 11));

  const SampleStats even = summarize({4, 1, 3, 2});
  CHECK(even.median == doctest::Approx(2.5));

  const SampleStats none = summarize({});
  CHECK(none.n == 0);
  CHECK(none.median == 0);
  CHECK(none.rel_se() == 0);  // no samples: no error to divide by zero
}

TEST_CASE("a score over contexts is the geometric mean of their medians") {
  const Score sc = combine({summarize({100, 100, 100}), summarize({400, 400, 400})});
  CHECK(sc.us == doctest::Approx(200));
  CHECK(sc.rel_se == 0);  // identical samples: no spread

  const SampleStats noisy = summarize({90, 100, 110, 100, 95, 105});
  const Score one = combine({noisy});
  CHECK(one.us == doctest::Approx(noisy.median));
  CHECK(one.rel_se == doctest::Approx(noisy.rel_se()));
  // Two independent contexts of the same spread: the mean's error shrinks by sqrt(2).
  const Score two = combine({noisy, noisy});
  CHECK(two.rel_se == doctest::Approx(noisy.rel_se() / std::sqrt(2.0)));

  CHECK(combine({}).us == 0);
}

TEST_CASE("a candidate is faster only beyond the minimum gain and 3x the combined noise") {
  const Score best{100.0, 0.0};

  SUBCASE("quiet timings: the minimum gain decides") {
    const Verdict small = judge({99.5, 0.0}, best, 0.01);
    CHECK_FALSE(small.faster);
    CHECK(small.gain == doctest::Approx(0.005));
    CHECK(small.threshold == doctest::Approx(0.01));
    CHECK(small.reason == "not faster: 99.50 us vs best 100.00 us: -0.50% (needs > 1.00%: the minimum gain)");

    const Verdict clear = judge({98.0, 0.0}, best, 0.01);
    CHECK(clear.faster);
    CHECK(clear.reason.rfind("faster: 98.00 us", 0) == 0);

    CHECK_FALSE(judge({100.0, 0.0}, best, 0.0).faster);  // a tie is not faster, even with no minimum
    CHECK_FALSE(judge({101.0, 0.0}, best, 0.01).faster);  // slower
  }

  SUBCASE("noisy timings: the same gain is not enough") {
    // Each score 1% relative error: 3 x sqrt(2) x 1% = 4.24% to beat.
    const Verdict v = judge({98.0, 0.01}, {100.0, 0.01}, 0.01);
    CHECK_FALSE(v.faster);
    CHECK(v.threshold == doctest::Approx(3 * std::sqrt(2.0) * 0.01));
    CHECK(v.reason.find("3x the measured noise") != std::string::npos);
    CHECK(judge({95.0, 0.01}, {100.0, 0.01}, 0.01).faster);
  }

  SUBCASE("no best to compare with") {
    const Verdict v = judge({50.0, 0.0}, {0.0, 0.0}, 0.01);
    CHECK_FALSE(v.faster);
    CHECK(v.gain == 0);
  }
}

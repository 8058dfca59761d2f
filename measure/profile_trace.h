// The profile trace a KT_PROFILE megakernel writes into args.trace (layout in
// kernels/kimi/cuda/abi.h), turned into what the runner reports: block 0's
// (tag, ns) stamps, and per grid barrier when the first, the median and the
// last block arrived. The arrivals say which blocks a phase waits for;
// block 0's stamps alone only say how long block 0 waited.
#pragma once

#include <cstdint>
#include <vector>

#include "base/json.h"

namespace ktune::measure {

// Words the runner allocates for a profiled step's trace.
size_t profile_trace_words();

// [[tag, ns], ...] in the order block 0 wrote them.
json trace_stamps(const std::vector<uint64_t>& trace);

// [[first ns, median ns, last ns, last block, 90th percentile ns], ...] per
// record of the blocks' part of the trace (a grid barrier's arrivals, or an
// event every block records), in launch order, up to the first record no
// block wrote. The median and the percentile are the lower ones between
// two blocks.
json barrier_arrivals(const std::vector<uint64_t>& trace);

}  // namespace ktune::measure

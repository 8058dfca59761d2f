// Wall-clock and monotonic time in seconds, as doubles.
#pragma once
#include <chrono>

namespace ktune {

// Seconds since the Unix epoch (for records a user reads).
inline double wall_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// Seconds on a clock that never jumps (for durations and deadlines).
inline double mono_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace ktune

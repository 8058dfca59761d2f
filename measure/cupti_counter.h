// Counts the kernels that actually ran on the GPU between begin() and end(),
// from CUPTI's activity records (kernel executions, not API calls). CUPTI is
// opened at run time; where it cannot be, end() returns the runner's own
// count and available() says why, so a report never claims a CUPTI count it
// did not make.
#pragma once
#include <string>

namespace ktune::measure {

class CuptiCounter {
 public:
  CuptiCounter();
  bool available() const { return ok_; }
  const std::string& unavailable_reason() const { return reason_; }
  void begin();
  // The kernels recorded since begin(); `fallback` when CUPTI is unavailable.
  int end(int fallback);

 private:
  bool ok_ = false;
  std::string reason_;
};

}  // namespace ktune::measure

// A NIC's PTP hardware clock (/dev/ptpN), read only to map its timestamps
// onto the system clock: PTP_SYS_OFFSET gives (sys, phc, sys) triples; the
// tightest one gives phc - sys, and two of them a rate, so a hardware stamp
// becomes a system-clock stamp by linear interpolation. Nothing is ever
// written to the PHC or the system clock.
#pragma once
#include <cstdint>
#include <string>

namespace shunt::clocksync {

class PhcClock {
 public:
  ~PhcClock();
  bool open(int phc_index, std::string* err);
  bool refresh();                       // takes a new (phc - sys) measurement
  int64_t to_system(int64_t phc_ns) const;
  bool ready() const { return n_ > 0; }

 private:
  int fd_ = -1;
  int n_ = 0;
  int64_t phc_[2] = {0, 0}, off_[2] = {0, 0};  // newest in [1]
};

}  // namespace shunt::clocksync

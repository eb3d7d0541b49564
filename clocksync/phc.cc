#include "clocksync/phc.h"

#include <fcntl.h>
#include <linux/ptp_clock.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace shunt::clocksync {

namespace {
int64_t ns(const ptp_clock_time& t) { return int64_t(t.sec) * 1'000'000'000 + t.nsec; }
}  // namespace

PhcClock::~PhcClock() {
  if (fd_ >= 0) close(fd_);
}

bool PhcClock::open(int idx, std::string* err) {
  std::string path = "/dev/ptp" + std::to_string(idx);
  fd_ = ::open(path.c_str(), O_RDONLY);
  if (fd_ < 0) {
    if (err) *err = path + ": " + strerror(errno);
    return false;
  }
  if (!refresh()) {
    if (err) *err = path + ": PTP_SYS_OFFSET: " + strerror(errno);
    return false;
  }
  return true;
}

bool PhcClock::refresh() {
  ptp_sys_offset req{};
  req.n_samples = 9;
  if (ioctl(fd_, PTP_SYS_OFFSET, &req) != 0) return false;
  // ts[] = sys0, phc0, sys1, phc1, ..., sysN: keep the tightest bracket.
  int64_t best_w = std::numeric_limits<int64_t>::max(), best_off = 0, best_phc = 0;
  for (unsigned i = 0; i < req.n_samples; i++) {
    int64_t s0 = ns(req.ts[2 * i]), p = ns(req.ts[2 * i + 1]), s1 = ns(req.ts[2 * i + 2]);
    if (s1 - s0 < best_w) {
      best_w = s1 - s0;
      best_phc = p;
      best_off = p - (s0 + (s1 - s0) / 2);
    }
  }
  phc_[0] = phc_[1];
  off_[0] = off_[1];
  phc_[1] = best_phc;
  off_[1] = best_off;
  if (n_ < 2) n_++;
  return true;
}

int64_t PhcClock::to_system(int64_t phc_ns) const {
  if (n_ < 2 || phc_[1] == phc_[0]) return phc_ns - off_[1];
  double rate = double(off_[1] - off_[0]) / double(phc_[1] - phc_[0]);
  return phc_ns - (off_[1] + int64_t(rate * double(phc_ns - phc_[1])));
}

}  // namespace shunt::clocksync

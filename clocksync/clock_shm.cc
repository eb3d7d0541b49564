#include "clocksync/clock_shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>

#include "core/seqlock.h"

namespace shunt::clocksync {

struct alignas(64) ShmEntry {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> valid;
  std::atomic<uint64_t> peer_id;
  std::atomic<int64_t> t_ref, updated;
  std::atomic<uint64_t> offset, drift, bound, bound_rate;  // doubles, bit-cast
  std::atomic<uint64_t> name[kShmNameLen / 8];
};

struct alignas(64) ShmHeader {
  std::atomic<uint32_t> magic;
  uint32_t version;
  uint32_t capacity;
  std::atomic<uint32_t> count;
  uint64_t self_id;
  char self_name[kShmNameLen];
  std::atomic<uint64_t> paths_gen;
  ShmEntry entries[];
};

static_assert(std::atomic<uint64_t>::is_always_lock_free);

namespace {
constexpr auto rlx = std::memory_order_relaxed;
uint64_t bits(double d) { return std::bit_cast<uint64_t>(d); }
double dbl(uint64_t u) { return std::bit_cast<double>(u); }
}  // namespace

ClockPublisher::~ClockPublisher() { close(false); }

bool ClockPublisher::open(const std::string& name, uint64_t self_id, std::string_view self_name,
                          int capacity, std::string* err) {
  close(false);
  size_t size = sizeof(ShmHeader) + sizeof(ShmEntry) * size_t(capacity);
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd < 0 || ftruncate(fd, off_t(size)) != 0) {
    if (err) *err = "shm_open/ftruncate " + name + ": " + strerror(errno);
    if (fd >= 0) ::close(fd);
    return false;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    if (err) *err = "mmap " + name + ": " + strerror(errno);
    return false;
  }
  std::memset(p, 0, size);
  auto* h = static_cast<ShmHeader*>(p);
  h->version = kShmVersion;
  h->capacity = uint32_t(capacity);
  h->self_id = self_id;
  std::strncpy(h->self_name, std::string(self_name).c_str(), kShmNameLen - 1);
  h->magic.store(kShmMagic, std::memory_order_release);  // readers check it last
  hdr_ = h;
  size_ = size;
  name_ = name;
  return true;
}

bool ClockPublisher::publish(int slot, const PublishedClock& c) {
  if (!hdr_ || slot < 0 || uint32_t(slot) >= hdr_->capacity) return false;
  ShmEntry& e = hdr_->entries[slot];
  uint32_t s = e.seq.load(rlx);
  seq_begin_write(e.seq, s + 1);
  e.valid.store(c.valid, rlx);
  e.peer_id.store(c.peer_id, rlx);
  e.t_ref.store(c.t_ref, rlx);
  e.updated.store(c.updated, rlx);
  e.offset.store(bits(c.offset_ns), rlx);
  e.drift.store(bits(c.drift), rlx);
  e.bound.store(bits(c.bound_ns), rlx);
  e.bound_rate.store(bits(c.bound_rate), rlx);
  char nm[kShmNameLen] = {};
  std::strncpy(nm, c.name.c_str(), kShmNameLen - 1);
  for (int i = 0; i < kShmNameLen / 8; i++) {
    uint64_t w;
    std::memcpy(&w, nm + 8 * i, 8);
    e.name[i].store(w, rlx);
  }
  e.seq.store(s + 2, std::memory_order_release);
  if (uint32_t(slot) >= hdr_->count.load(rlx)) hdr_->count.store(uint32_t(slot) + 1, std::memory_order_release);
  return true;
}

namespace {
// The futex word: the low half of paths_gen (a change of the count changes
// it, short of 2^32 changes between two looks).
static_assert(std::endian::native == std::endian::little);
uint32_t* gen_word(const ShmHeader* h) {
  return reinterpret_cast<uint32_t*>(const_cast<std::atomic<uint64_t>*>(&h->paths_gen));
}
}  // namespace

void ClockPublisher::bump_paths_gen() {
  if (!hdr_) return;
  hdr_->paths_gen.fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, gen_word(hdr_), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void ClockPublisher::close(bool unlink) {
  if (hdr_) munmap(hdr_, size_);
  if (hdr_ && unlink) shm_unlink(name_.c_str());
  hdr_ = nullptr;
}

ClockReader::~ClockReader() {
  if (hdr_) munmap(const_cast<ShmHeader*>(hdr_), size_);
}

bool ClockReader::open(const std::string& name, std::string* err) {
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || size_t(st.st_size) < sizeof(ShmHeader)) {
    if (err) *err = "shm_open " + name + ": " + (fd < 0 ? strerror(errno) : "too small");
    if (fd >= 0) ::close(fd);
    return false;
  }
  void* p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    if (err) *err = std::string("mmap: ") + strerror(errno);
    return false;
  }
  auto* h = static_cast<const ShmHeader*>(p);
  if (h->magic.load(std::memory_order_acquire) != kShmMagic || h->version != kShmVersion ||
      sizeof(ShmHeader) + sizeof(ShmEntry) * h->capacity > size_t(st.st_size)) {
    munmap(p, size_t(st.st_size));
    if (err) *err = name + ": not a shunt clock segment (or an incompatible version)";
    return false;
  }
  if (hdr_) munmap(const_cast<ShmHeader*>(hdr_), size_);
  hdr_ = h;
  size_ = size_t(st.st_size);
  ino_ = uint64_t(st.st_ino);
  return true;
}

uint64_t ClockReader::paths_gen() const { return hdr_ ? hdr_->paths_gen.load(std::memory_order_acquire) : 0; }

bool ClockReader::wait_paths_gen(uint64_t seen, int timeout_ms) const {
  if (!hdr_) return false;
  if (paths_gen() != seen) return true;
  timespec to{timeout_ms / 1000, long(timeout_ms % 1000) * 1'000'000};
  // Shared (no FUTEX_PRIVATE_FLAG): the publisher is another process.
  syscall(SYS_futex, gen_word(hdr_), FUTEX_WAIT, uint32_t(seen), &to, nullptr, 0);
  return paths_gen() != seen;
}

bool ClockReader::replaced(const std::string& name) const {
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  struct stat st;
  bool same = fd >= 0 && fstat(fd, &st) == 0 && uint64_t(st.st_ino) == ino_;
  if (fd >= 0) ::close(fd);
  return !same;
}

int ClockReader::count() const { return hdr_ ? int(hdr_->count.load(std::memory_order_acquire)) : 0; }
uint64_t ClockReader::self_id() const { return hdr_ ? hdr_->self_id : 0; }

std::optional<PublishedClock> ClockReader::read(int slot) const {
  if (!hdr_ || slot < 0 || slot >= count()) return std::nullopt;
  const ShmEntry& e = hdr_->entries[slot];
  for (int tries = 0; tries < 1000; tries++) {
    uint32_t s1 = e.seq.load(std::memory_order_acquire);
    if (s1 & 1) continue;
    PublishedClock c;
    c.valid = e.valid.load(rlx);
    c.peer_id = e.peer_id.load(rlx);
    c.t_ref = e.t_ref.load(rlx);
    c.updated = e.updated.load(rlx);
    c.offset_ns = dbl(e.offset.load(rlx));
    c.drift = dbl(e.drift.load(rlx));
    c.bound_ns = dbl(e.bound.load(rlx));
    c.bound_rate = dbl(e.bound_rate.load(rlx));
    char nm[kShmNameLen];
    for (int i = 0; i < kShmNameLen / 8; i++) {
      uint64_t w = e.name[i].load(rlx);
      std::memcpy(nm + 8 * i, &w, 8);
    }
    nm[kShmNameLen - 1] = 0;
    if (seq_reread(e.seq) != s1) continue;
    c.name = nm;
    return c;
  }
  return std::nullopt;  // a writer that keeps racing us: try again later
}

std::optional<PublishedClock> ClockReader::find(std::string_view peer_name) const {
  for (int i = 0; i < count(); i++)
    if (auto c = read(i); c && c->name == peer_name) return c;
  return std::nullopt;
}

}  // namespace shunt::clocksync

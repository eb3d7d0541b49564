// The per-peer clock models, published in POSIX shared memory so that every
// process on the host converts its own timestamps without asking anyone:
//   peer_time(t) = t + offset_ns + drift * (t - t_ref), error <= bound(t).
// One writer (the probe engine), any number of readers. Each entry is a
// seqlock: the writer makes the sequence odd, writes, makes it even; a reader
// retries while it is odd or changed under it. Fields are relaxed atomics so
// the protocol is also clean under TSan. Nothing here ever sets a clock.
// The header also counts the engine's source paths' liveness changes, so a
// process watching some of them asks the engine only when one changed.
#pragma once
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shunt::clocksync {

inline constexpr uint32_t kShmMagic = 0x5348434b;  // "SHCK"
inline constexpr uint32_t kShmVersion = 2;
inline constexpr int kShmNameLen = 32;

struct PublishedClock {
  uint64_t peer_id = 0;
  std::string name;
  int64_t t_ref = 0;         // local ns
  double offset_ns = 0;      // peer minus local at t_ref (loop-corrected when available)
  double drift = 0;          // ns per ns
  double bound_ns = 0;       // at t_ref
  double bound_rate = 0;     // growth per ns after t_ref (holdover)
  int64_t updated = 0;       // local ns of the last write
  bool valid = false;

  double offset_at(int64_t t) const { return offset_ns + drift * double(t - t_ref); }
  double bound_at(int64_t t) const { return bound_ns + bound_rate * double(t > t_ref ? t - t_ref : 0); }
};

struct ShmEntry;
struct ShmHeader;

class ClockPublisher {
 public:
  ClockPublisher() = default;
  ~ClockPublisher();
  ClockPublisher(const ClockPublisher&) = delete;
  ClockPublisher& operator=(const ClockPublisher&) = delete;
  // Creates (or takes over) the segment `name` (shm_open name, leading '/').
  bool open(const std::string& name, uint64_t self_id, std::string_view self_name, int capacity,
            std::string* err);
  // Writes entry `slot` (0..capacity-1); slots at or past count() extend it.
  bool publish(int slot, const PublishedClock& c);
  // A source path turned alive or dead (after its state changed). Wakes
  // the readers waiting in wait_paths_gen.
  void bump_paths_gen();
  void close(bool unlink);
  bool is_open() const { return hdr_ != nullptr; }

 private:
  ShmHeader* hdr_ = nullptr;
  size_t size_ = 0;
  std::string name_;
};

class ClockReader {
 public:
  ClockReader() = default;
  ~ClockReader();
  ClockReader(const ClockReader&) = delete;
  ClockReader& operator=(const ClockReader&) = delete;
  bool open(const std::string& name, std::string* err);
  int count() const;
  std::optional<PublishedClock> read(int slot) const;
  std::optional<PublishedClock> find(std::string_view peer_name) const;
  uint64_t self_id() const;
  // How many source path liveness changes the engine has published.
  uint64_t paths_gen() const;
  // Sleeps until paths_gen() is no longer `seen` or timeout_ms passed (a
  // futex on the shared segment: no polling). Whether it changed.
  bool wait_paths_gen(uint64_t seen, int timeout_ms) const;
  // Whether the name now names another segment than the one mapped (the
  // engine's process ended and another one's engine made it anew).
  bool replaced(const std::string& name) const;

 private:
  const ShmHeader* hdr_ = nullptr;
  size_t size_ = 0;
  uint64_t ino_ = 0;
};

}  // namespace shunt::clocksync

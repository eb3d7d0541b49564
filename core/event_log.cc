#include "core/event_log.h"

#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/event_ring.h"
#include "core/identity.h"
#include "core/json_text.h"
#include "core/log.h"
#include "core/runtime.h"
#include "core/threads.h"

namespace shunt::telemetry {

namespace {
using nlohmann::json;

enum EventType {
#define SHUNT_X(n) ev_##n,
  SHUNT_EVENT_TYPES(SHUNT_X)
#undef SHUNT_X
      ev_count_
};
const char* const kTypeNames[] = {
#define SHUNT_X(n) #n,
    SHUNT_EVENT_TYPES(SHUNT_X)
#undef SHUNT_X
};
std::atomic<uint64_t> g_counts[ev_count_];
std::atomic<uint64_t> g_dropped{0};

int type_index(const char* type) {
  for (int i = 0; i < ev_other; i++)
    if (strcmp(type, kTypeNames[i]) == 0) return i;
  return ev_other;
}

struct Entry {
  int64_t wall_ns, mono_ns;
  char type[32];
  uint16_t len;
  char body[720];
};
using Ring = MpscRing<Entry, 512>;

int64_t clock_ns(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

// Log state: decided once (enabled or not), then the ring and the writer.
struct Log {
  std::atomic<int> enabled{-1};  // -1 undecided, 0 no log, 1 log
  std::atomic<bool> writer_started{false};
  std::once_flag once;
  Ring* ring = nullptr;
  std::mutex consume_mu;  // the ring has one consumer at a time: writer or flush
  int fd = -1;
  std::string path, prefix;  // prefix: the fields every line of this process carries
  std::string config_line;   // written first, by whoever drains first
};
Log& lg() {
  static Log* l = new Log;
  return *l;
}

bool log_enabled() {
  Log& l = lg();
  int e = l.enabled.load(std::memory_order_acquire);
  if (__builtin_expect(e >= 0, 1)) return e == 1;
  std::call_once(l.once, [&l] {
    bool on = current_mode() != Mode::off && !config().str(Param::event_log).empty();
    if (on) l.ring = new Ring;
    l.enabled.store(on ? 1 : 0, std::memory_order_release);
  });
  return l.enabled.load(std::memory_order_acquire) == 1;
}

class Appender {
 public:
  Appender(char* buf, size_t cap) : b_(buf), cap_(cap) {}
  void raw(const char* s, size_t n) {
    for (size_t i = 0; i < n; i++) {
      if (n_ + 1 >= cap_) {
        full_ = true;
        return;
      }
      b_[n_++] = s[i];
    }
  }
  void raw(const char* s) { raw(s, strlen(s)); }
  // A JSON string; bytes that are not UTF-8 (a path, a peer's name from
  // the environment) become \ufffd, else readers would reject the line.
  void str(const char* s) {
    raw("\"");
    for (size_t n = 1; s && *s; s += n) {
      unsigned char c = static_cast<unsigned char>(*s);
      n = 1;
      if (c == '"' || c == '\\') {
        char e[2] = {'\\', static_cast<char>(c)};
        raw(e, 2);
      } else if (c < 0x20) {
        char e[8];
        snprintf(e, sizeof e, "\\u%04x", c);
        raw(e);
      } else if (c < 0x80) {
        raw(s, 1);
      } else if ((n = utf8_sequence(std::string_view(s, strnlen(s, 4)))) > 0) {
        raw(s, n);
      } else {
        n = 1;
        raw("\\ufffd");
      }
    }
    raw("\"");
  }
  size_t size() const { return n_; }
  bool full() const { return full_; }

 private:
  char* b_;
  size_t cap_, n_ = 0;
  bool full_ = false;
};

std::string time_str(int64_t wall_ns) {
  time_t s = wall_ns / 1'000'000'000;
  tm t;
  gmtime_r(&s, &t);
  char buf[64];
  size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &t);
  snprintf(buf + n, sizeof buf - n, ".%09lldZ", static_cast<long long>(wall_ns % 1'000'000'000));
  return buf;
}

void write_line(Log& l, const std::string& line) {
  if (l.fd < 0) {
    l.fd = open(l.path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (l.fd < 0) {
      log::once(LogLevel::warn, "event-log", fmt::format("SHUNT_EVENT_LOG: cannot open {}: {}", l.path, strerror(errno)));
      return;
    }
  }
  // One write per line: with O_APPEND, processes sharing a log never interleave.
  if (::write(l.fd, line.data(), line.size()) < 0) return;
}

std::string line_of(const Log& l, const Entry& e) {
  std::string s = "{\"time\":\"" + time_str(e.wall_ns) + "\",\"wall_ns\":" + std::to_string(e.wall_ns) +
                  ",\"mono_ns\":" + std::to_string(e.mono_ns) + l.prefix + ",\"event\":";
  char t[80];
  Appender a(t, sizeof t);
  a.str(e.type);
  s.append(t, a.size());
  if (e.len) {
    s += ',';
    s.append(e.body, e.len);
  }
  s += "}\n";
  return s;
}

// Drains the ring; true if it wrote anything.
bool drain(Log& l) {
  std::lock_guard lk(l.consume_mu);
  bool any = false;
  if (!l.config_line.empty()) {
    write_line(l, l.config_line);
    l.config_line.clear();
  }
  while (l.ring->pop([&](const Entry& e) { write_line(l, line_of(l, e)); })) any = true;
  return any;
}

std::string enum_value(const ParamSpec& s, long long idx) {
  std::string choices = s.choices;
  size_t start = 0;
  for (long long k = 0; k < idx && start != std::string::npos; k++) {
    start = choices.find('|', start);
    if (start != std::string::npos) start++;
  }
  if (start == std::string::npos) return std::to_string(idx);
  return choices.substr(start, choices.find('|', start) - start);
}

// Every variable not at its default, with its value (the job key hidden).
json config_set() {
  json vars = json::object();
  const Config& c = config();
  auto specs = param_specs();
  for (size_t i = 0; i < specs.size(); i++) {
    auto p = static_cast<Param>(i);
    if (c.source(p) == "default") continue;
    if (p == Param::job_key) vars[specs[i].name] = "(set)";
    else if (specs[i].kind == ParamKind::Enum) vars[specs[i].name] = enum_value(specs[i], c.num(p));
    else if (specs[i].kind == ParamKind::Int) vars[specs[i].name] = c.num(p);
    else vars[specs[i].name] = c.str(p);
  }
  return vars;
}

[[noreturn]] void writer_loop() {
  ReentryGuard g;
  pthread_setname_np(pthread_self(), "shunt-events");
  Log& l = lg();
  for (;;)
    if (!drain(l)) usleep(20'000);
}

void flush_at_exit() { flush_event_log(); }

void after_fork_child() {
  Log& l = lg();
  if (l.enabled.load() != 1) return;
  // The parent's writer did not come along; its pending entries are its own.
  l.ring->reset();
  new (&l.consume_mu) std::mutex;
  if (l.fd >= 0) ::close(l.fd);
  l.fd = -1;
  l.config_line.clear();
  l.writer_started.store(false);
}

void start_writer() {
  Log& l = lg();
  static std::mutex start_mu;
  std::lock_guard lk(start_mu);
  if (l.writer_started.load()) return;
  ReentryGuard g;
  static bool hooks_done = false;
  if (!hooks_done) {
    pthread_atfork(nullptr, nullptr, after_fork_child);
    at_exit(flush_at_exit);
    hooks_done = true;
  }
  int pid = getpid();
  l.path = expand_pattern(config().str(Param::event_log), pid);
  json id = {{"host", host_name()}, {"pid", pid}, {"job", job_id()}, {"rank", rank()}};
  std::string d = to_text(id);
  l.prefix = "," + d.substr(1, d.size() - 2);
  int64_t wall = clock_ns(CLOCK_REALTIME), mono = clock_ns(CLOCK_MONOTONIC);
  const char* modes[] = {"off", "observe", "active"};
  json cfg = {{"time", time_str(wall)}, {"wall_ns", wall}, {"mono_ns", mono}};
  cfg.update(id);
  cfg.update(json{{"event", "config"},
                  {"version", SHUNT_VERSION},
                  {"mode", modes[static_cast<int>(current_mode())]},
                  {"set", config_set()}});
  l.config_line = to_text(cfg) + "\n";
  g_counts[ev_config].fetch_add(1, std::memory_order_relaxed);
  l.writer_started.store(true, std::memory_order_release);
  start_thread("event log writer", writer_loop);  // without it, the ring keeps the newest events
}
}  // namespace

size_t format_fields(char* buf, size_t cap, std::initializer_list<Field> fields) {
  Appender a(buf, cap);
  size_t whole = 0;
  bool first = true;
  for (const Field& f : fields) {
    if (!first) a.raw(",");
    a.str(f.key);
    a.raw(":");
    char num[40];
    switch (f.kind) {
      case Field::Kind::str: a.str(f.s ? f.s : ""); break;
      case Field::Kind::boolean: a.raw(f.i ? "true" : "false"); break;
      case Field::Kind::i64:
        snprintf(num, sizeof num, "%lld", static_cast<long long>(f.i));
        a.raw(num);
        break;
      case Field::Kind::f64:
        if (std::isfinite(f.d)) snprintf(num, sizeof num, "%.17g", f.d);
        else snprintf(num, sizeof num, "null");
        a.raw(num);
        break;
    }
    if (a.full()) break;  // cut at the last whole field
    whole = a.size();
    first = false;
  }
  return whole;
}

void event(const char* type, std::initializer_list<Field> fields) {
  g_counts[type_index(type)].fetch_add(1, std::memory_order_relaxed);
  if (!log_enabled()) return;
  Log& l = lg();
  if (!l.writer_started.load(std::memory_order_acquire)) start_writer();
  int64_t wall = clock_ns(CLOCK_REALTIME), mono = clock_ns(CLOCK_MONOTONIC);
  bool ok = l.ring->push([&](Entry& e) {
    e.wall_ns = wall;
    e.mono_ns = mono;
    snprintf(e.type, sizeof e.type, "%s", type);
    e.len = static_cast<uint16_t>(format_fields(e.body, sizeof e.body, fields));
  });
  if (!ok) g_dropped.fetch_add(1, std::memory_order_relaxed);
}

void start_event_log() {
  if (log_enabled()) start_writer();
}

void flush_event_log() {
  if (!log_enabled() || !lg().writer_started.load()) return;
  ReentryGuard g;
  drain(lg());
}

std::string event_log_path() {
  if (!log_enabled()) return "";
  Log& l = lg();
  if (l.writer_started.load(std::memory_order_acquire)) return l.path;
  return expand_pattern(config().str(Param::event_log), getpid());
}

uint64_t event_count(const char* type) { return g_counts[type_index(type)].load(std::memory_order_relaxed); }

json event_counts() {
  json out = json::object();
  for (int i = 0; i < ev_count_; i++) out[kTypeNames[i]] = g_counts[i].load(std::memory_order_relaxed);
  return out;
}

uint64_t events_dropped() { return g_dropped.load(std::memory_order_relaxed); }

}  // namespace shunt::telemetry

#include "core/roce_rails.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <mutex>
#include <set>
#include <string_view>

#include "core/mono.h"

namespace shunt {

namespace {

// The first line of a small sysfs file, or "" when it cannot be read (an
// unused GID's attributes answer EINVAL).
std::string first_line(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return "";
  char buf[256];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return "";
  std::string s(buf, size_t(n));
  return s.substr(0, s.find('\n'));
}

// Entries of a directory (no dot files), at most `max`.
std::vector<std::string> entries(const std::string& dir, size_t max = 4096) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.' && out.size() < max) out.push_back(e->d_name);
  closedir(d);
  return out;
}

// Names in natural order: digit runs compare as numbers (mlx5_2 < mlx5_10).
bool natural_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (isdigit(static_cast<unsigned char>(a[i])) && isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && a[i2] == '0') i2++;
      while (j2 < b.size() && b[j2] == '0') j2++;
      size_t ie = i2, je = j2;
      while (ie < a.size() && isdigit(static_cast<unsigned char>(a[ie]))) ie++;
      while (je < b.size() && isdigit(static_cast<unsigned char>(b[je]))) je++;
      if (ie - i2 != je - j2) return ie - i2 < je - j2;
      if (int c = a.substr(i2, ie - i2).compare(b.substr(j2, je - j2))) return c < 0;
      i = ie, j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    i++, j++;
  }
  return a.size() - i < b.size() - j;
}

// The IPv4 address of an IPv4-mapped GID as sysfs writes it
// (0000:0000:0000:0000:0000:ffff:0a00:0001 is 10.0.0.1).
bool gid_ipv4(const std::string& text, std::string* ip) {
  uint8_t raw[16];
  int n = 0;
  for (size_t i = 0; i < text.size();) {
    if (text[i] == ':') {
      i++;
      continue;
    }
    if (n == 16 || i + 1 >= text.size() || !isxdigit(static_cast<unsigned char>(text[i])) ||
        !isxdigit(static_cast<unsigned char>(text[i + 1])))
      return false;
    raw[n++] = static_cast<uint8_t>(std::stoi(text.substr(i, 2), nullptr, 16));
    i += 2;
  }
  if (n != 16 || raw[10] != 0xff || raw[11] != 0xff) return false;
  for (int k = 0; k < 10; k++)
    if (raw[k]) return false;
  char buf[INET_ADDRSTRLEN];
  if (!inet_ntop(AF_INET, raw + 12, buf, sizeof buf)) return false;
  *ip = buf;
  return true;
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() < 6 && std::all_of(s.begin(), s.end(), [](char c) {
    return isdigit(static_cast<unsigned char>(c));
  });
}

std::vector<int> numbered(const std::string& dir) {
  std::vector<int> out;
  for (auto& e : entries(dir))
    if (all_digits(e)) out.push_back(std::stoi(e));
  std::sort(out.begin(), out.end());
  return out;
}

// One rail per netdev and per address, in the order they come.
struct Seen {
  std::set<std::string> netdevs, ips;
  bool take(const std::string& nd, const std::string& ip) {
    if (nd.empty() || netdevs.count(nd) || ips.count(ip)) return false;
    netdevs.insert(nd);
    ips.insert(ip);
    return true;
  }
};

std::vector<std::string> sorted_names(std::vector<std::string> v) {
  std::sort(v.begin(), v.end(), [](const std::string& a, const std::string& b) { return natural_less(a, b); });
  return v;
}

// The same from the verbs API: one call per device returns its valid GID
// entries alone (ibv_query_gid_table). sysfs has a file per table entry,
// used or not: 1024 per rxe port, read three syscalls each, which took an
// emulated guest's agent 0.5-0.9 s before it answered anything. false
// where the API does not answer; then sysfs is read.
bool verbs_rails(std::vector<RoceRail>* out, int* devices) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return false;
  std::vector<std::string> names;
  for (int i = 0; i < n; i++) names.push_back(ibv_get_device_name(list[i]));
  if (devices) *devices = n;
  Seen seen;
  bool ok = true;
  for (const auto& name : sorted_names(names)) {
    ibv_device* dev = nullptr;
    for (int i = 0; i < n; i++)
      if (name == ibv_get_device_name(list[i])) dev = list[i];
    ibv_context* ctx = dev ? ibv_open_device(dev) : nullptr;
    if (!ctx) continue;  // (sysfs would show its ports; a device that cannot be opened carries nothing)
    ibv_device_attr da{};
    std::vector<ibv_gid_entry> gids;
    std::vector<bool> active;
    if (ibv_query_device(ctx, &da) == 0) {
      size_t len = 0;
      active.assign(size_t(da.phys_port_cnt) + 1, false);
      for (int port = 1; port <= int(da.phys_port_cnt); port++) {  // (an 8-bit counter would wrap at 255)
        ibv_port_attr pa{};
        if (ibv_query_port(ctx, uint8_t(port), &pa) != 0) continue;
        active[port] = pa.state == IBV_PORT_ACTIVE;
        len += size_t(pa.gid_tbl_len);
      }
      gids.resize(len);
      ssize_t got = len ? ibv_query_gid_table(ctx, gids.data(), len, 0) : 0;
      if (got < 0) ok = false;
      gids.resize(got > 0 ? size_t(got) : 0);
    }
    ibv_close_device(ctx);
    if (!ok) break;
    std::sort(gids.begin(), gids.end(), [](const ibv_gid_entry& a, const ibv_gid_entry& b) {
      return a.port_num != b.port_num ? a.port_num < b.port_num : a.gid_index < b.gid_index;
    });
    for (const auto& e : gids) {
      if (e.port_num >= active.size() || !active[e.port_num]) continue;
      if (e.gid_type != IBV_GID_TYPE_ROCE_V1 && e.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
      const uint8_t* raw = e.gid.raw;
      if (std::any_of(raw, raw + 10, [](uint8_t b) { return b != 0; }) || raw[10] != 0xff || raw[11] != 0xff) continue;
      char ip[INET_ADDRSTRLEN], nd[IF_NAMESIZE];
      if (!inet_ntop(AF_INET, raw + 12, ip, sizeof ip) || !if_indextoname(e.ndev_ifindex, nd)) continue;
      if (seen.take(nd, ip)) out->push_back({name, int(e.port_num), nd, ip});
    }
  }
  ibv_free_device_list(list);
  if (!ok) out->clear();
  return ok;
}

std::vector<RoceRail> sysfs_rails(const std::string& root, int* devices) {
  std::vector<std::string> devs = sorted_names(entries(root, 256));
  if (devices) *devices = int(devs.size());
  std::vector<RoceRail> out;
  Seen seen;
  for (const auto& dev : devs) {
    const std::string ports = root + "/" + dev + "/ports";
    for (int port : numbered(ports)) {
      const std::string pdir = ports + "/" + std::to_string(port);
      if (first_line(pdir + "/state").find("ACTIVE") == std::string::npos) continue;
      for (int i : numbered(pdir + "/gids")) {
        const std::string n = std::to_string(i);
        const std::string type = first_line(pdir + "/gid_attrs/types/" + n);
        if (type != "RoCE v2" && type != "IB/RoCE v1" && type != "RoCE v1") continue;
        std::string ip;
        if (!gid_ipv4(first_line(pdir + "/gids/" + n), &ip)) continue;
        const std::string nd = first_line(pdir + "/gid_attrs/ndevs/" + n);
        if (seen.take(nd, ip)) out.push_back({dev, port, nd, ip});
      }
    }
  }
  return out;
}

constexpr const char* kSysfs = "/sys/class/infiniband";
}  // namespace

// The agent's services each ask at start (probing, sockets, the engine's
// config): one answer serves them all for a few seconds.
std::vector<RoceRail> roce_rails(const std::string& root, int* devices) {
  struct Cached {
    std::string root;
    int64_t at_ms = 0;
    int devices = 0;
    std::vector<RoceRail> rails;
  };
  static std::mutex mu;
  static Cached* cache = new Cached;  // never freed: a thread may ask during exit
  std::lock_guard lk(mu);
  const int64_t now = mono_ms();
  if (cache->at_ms == 0 || cache->root != root || now - cache->at_ms > 2000) {
    Cached c{root, now, 0, {}};
    if (root != kSysfs || !verbs_rails(&c.rails, &c.devices)) c.rails = sysfs_rails(root, &c.devices);
    *cache = std::move(c);
  }
  if (devices) *devices = cache->devices;
  return cache->rails;
}

ProbeRails probe_rails(const Config& c) {
  ProbeRails r;
  const std::string& named = c.str(Param::probe_addrs);
  if (named == "none") {
    r.from = RailsFrom::none;
    return r;
  }
  if (!named.empty()) {
    std::string_view rest = named;
    while (!rest.empty()) {
      auto comma = rest.find(',');
      std::string a(rest.substr(0, comma));
      if (!a.empty()) r.addrs.push_back(a);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
    return r;
  }
  r.from = RailsFrom::roce_ports;
  for (auto& x : roce_rails(c.str(Param::test_ib_sysfs), &r.devices)) r.addrs.push_back(x.ip);
  return r;
}

const char* rails_from_text(RailsFrom f) {
  switch (f) {
    case RailsFrom::named:
      return "SHUNT_PROBE_ADDRS";
    case RailsFrom::none:
      return "none (SHUNT_PROBE_ADDRS=none)";
    case RailsFrom::roce_ports:
      return "RoCE ports";
  }
  return "";
}

ProbePlan probe_plan(const ProbeRails& rails, bool have_key) {
  ProbePlan p;
  if (rails.addrs.empty()) {
    if (rails.from == RailsFrom::none) return p;  // asked for: nothing to say
    if (rails.from == RailsFrom::roce_ports)
      p.message =
          std::string(rails.devices ? "no active RoCE port with an IPv4 address"
                                    : "no RDMA device") +
          ", so no probing and no TCP rails: TCP sockets are MPTCP on the kernel's own endpoints, "
          "one path unless those add more; SHUNT_SOCKET_RAILS=auto (or a list) turns multipath on";
    return p;
  }
  if (!have_key) {
    p.level = LogLevel::warn;
    p.message = "no SHUNT_JOB_KEY, so no probing on the rails (" +
                std::string(rails_from_text(rails.from)) +
                "): probes under a key anyone can derive could be forged by anyone on the network; "
                "set SHUNT_JOB_KEY to one secret on every host (shunt-run sets one)";
    return p;
  }
  p.start = true;
  return p;
}

}  // namespace shunt

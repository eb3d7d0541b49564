#include "tools/shunt-audit/facts.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <infiniband/verbs.h>
#include <link.h>
#include <net/if.h>
#include <sys/resource.h>
#include <sys/timex.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

using nlohmann::json;

namespace audit {

std::string g_preloaded;

namespace {

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> out;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.emplace_back(e->d_name);
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool exists(const std::string& p) {
  return access(p.c_str(), F_OK) == 0;
}

// The RDMA provider drivers a host may load (kernel modules).
const char* const kProviders[] = {"mlx5_ib", "mlx4_ib",    "rdma_rxe",       "siw",  "irdma",
                                  "bnxt_re", "efa",        "hns_roce_hw_v2", "qedr", "erdma",
                                  "mana_ib", "ionic_rdma", "cxgb4"};

std::string rdma_core_version() {
  // libibverbs.so.1.14.44.0: the last two parts are rdma-core's release.
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* i, size_t, void* out) {
        if (i->dlpi_name && strstr(i->dlpi_name, "libibverbs.so"))
          *static_cast<std::string*>(out) = i->dlpi_name;
        return 0;
      },
      &found);
  if (found.empty()) return "";
  char* real = realpath(found.c_str(), nullptr);
  std::string r = real ? real : found;
  free(real);
  auto pos = r.find("libibverbs.so.");
  if (pos == std::string::npos) return "";
  std::string v = r.substr(pos + 14);  // 1.14.44.0
  int dots = 0;
  for (size_t k = 0; k < v.size(); k++)
    if (v[k] == '.' && ++dots == 2) return v.substr(k + 1);
  return v;
}

bool shunt_loaded() {
  bool found = false;
  dl_iterate_phdr(
      [](dl_phdr_info* i, size_t, void* out) {
        if (i->dlpi_name && strstr(i->dlpi_name, "libshunt.so")) *static_cast<bool*>(out) = true;
        return 0;
      },
      &found);
  const char* pre = getenv("LD_PRELOAD");
  return found || !g_preloaded.empty() || (pre && strstr(pre, "libshunt.so"));
}

// libnccl.so.2.X.Y in the directories the loader searches, or in pip's
// nvidia-nccl wheel: its path and version.
json find_nccl() {
  std::vector<std::string> dirs;
  if (const char* l = getenv("LD_LIBRARY_PATH")) {
    std::stringstream ss(l);
    for (std::string d; std::getline(ss, d, ':');)
      if (!d.empty()) dirs.push_back(d);
  }
  for (auto* d :
       {"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/lib", "/usr/lib",
        "/usr/lib64", "/usr/local/cuda/lib64", "/usr/local/nccl/lib", "/opt/nccl/lib"})
    dirs.push_back(d);
  for (auto& d : dirs)
    for (auto& f : list_dir(d))
      if (f.rfind("libnccl.so", 0) == 0) {
        std::string best = f;
        for (auto& g : list_dir(d))  // the most specific name carries the version
          if (g.rfind("libnccl.so.", 0) == 0 && g.size() > best.size()) best = g;
        std::string v = best.size() > 11 ? best.substr(11) : "";
        return {{"path", d + "/" + best}, {"version", v}};
      }
  return json::object();
}

bool cap_ipc_lock() {
  std::ifstream f("/proc/self/status");
  for (std::string l; std::getline(f, l);)
    if (l.rfind("CapEff:", 0) == 0)
      return (std::stoull(l.substr(7), nullptr, 16) >> 14) & 1;  // CAP_IPC_LOCK = 14
  return false;
}

const char* width_text(uint8_t w) {
  switch (w) {
    case 1:
      return "1X";
    case 2:
      return "4X";
    case 4:
      return "8X";
    case 8:
      return "12X";
    case 16:
      return "2X";
  }
  return "?";
}

json counters_of(const std::string& dev, int port) {
  json c = json::object();
  std::string base = "/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port);
  for (auto* sub : {"/counters/", "/hw_counters/"})
    for (auto& name : list_dir(base + sub)) {
      std::string v = read_line(base + sub + name);
      char* end = nullptr;
      unsigned long long x = strtoull(v.c_str(), &end, 10);
      if (!v.empty() && end && *end == 0) c[name] = x;
    }
  return c;
}

std::vector<std::string> device_names(const std::vector<std::string>& wanted) {
  if (!wanted.empty()) return wanted;
  std::vector<std::string> out;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n; i++) out.emplace_back(ibv_get_device_name(list[i]));
  if (list) ibv_free_device_list(list);
  std::sort(out.begin(), out.end());
  return out;
}

json device_facts(const std::string& name) {
  json d{{"name", name}, {"ports", json::array()}};
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = nullptr;
  for (int i = 0; list && i < n && !ctx; i++)
    if (name == ibv_get_device_name(list[i])) ctx = ibv_open_device(list[i]);
  if (list) ibv_free_device_list(list);
  if (!ctx) {
    d["error"] = "cannot open " + name;
    return d;
  }
  ibv_device_attr da{};
  ibv_query_device(ctx, &da);
  for (int p = 1; p <= da.phys_port_cnt; p++) {
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, p, &pa)) continue;
    json j{{"port", p},
           {"state", pa.state == IBV_PORT_ACTIVE ? "ACTIVE" : ibv_port_state_str(pa.state)},
           {"mtu", 128 << pa.active_mtu},
           {"width", width_text(pa.active_width)},
           {"speed",
            read_line("/sys/class/infiniband/" + name + "/ports/" + std::to_string(p) + "/rate")},
           {"link_layer", pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand"}};
    // The first RoCEv2 GID that carries an IPv4 address: what a routed
    // RoCE fabric addresses this port by.
    for (int g = 0; g < pa.gid_tbl_len; g++) {
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(ctx, p, g, &e, 0) != 0 || e.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
      static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      char ifn[IF_NAMESIZE] = "";
      if (e.ndev_ifindex && if_indextoname(e.ndev_ifindex, ifn)) j["netdev"] = ifn;
      if (memcmp(e.gid.raw, v4, 12) != 0) continue;
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, e.gid.raw + 12, ip, sizeof ip);
      j["ipv4"] = ip;
      j["gid_index"] = g;
      break;
    }
    if (j.contains("netdev"))
      j["netdev_mtu"] = read_line("/sys/class/net/" + j["netdev"].get<std::string>() + "/mtu");
    j["counters"] = counters_of(name, p);
    d["ports"].push_back(j);
  }
  ibv_close_device(ctx);
  return d;
}

}  // namespace

json host_facts(const std::vector<std::string>& devices) {
  json f;
  utsname u{};
  uname(&u);
  f["hostname"] = u.nodename;
  f["kernel"] = u.release;
  json mods = json::array();
  for (auto* m : kProviders)
    if (exists(std::string("/sys/module/") + m)) mods.push_back(m);
  f["provider_modules"] = mods;
  std::string mp = read_line("/proc/sys/net/mptcp/enabled");
  f["mptcp"] = mp.empty() ? -1 : std::atoi(mp.c_str());
  f["rdma_core"] = rdma_core_version();
  rlimit rl{};
  getrlimit(RLIMIT_MEMLOCK, &rl);
  f["memlock"] = {{"soft", rl.rlim_cur == RLIM_INFINITY ? -1.0 : double(rl.rlim_cur)},
                  {"cap_ipc_lock", cap_ipc_lock()}};
  f["nccl"] = find_nccl();
  f["shunt_preloaded"] = shunt_loaded();
  // Whether something (chrony, ntpd, ptp4l's phc2sys) disciplines the
  // system clock: the kernel's own flag, read without changing anything.
  timex tx{};
  int state = adjtimex(&tx);
  f["clock"] = {{"synchronized", state != -1 && state != TIME_ERROR && !(tx.status & STA_UNSYNC)},
                {"maxerror_us", tx.maxerror},
                {"ptp_clocks", static_cast<int>(list_dir("/sys/class/ptp").size())}};
  f["devices"] = json::array();
  for (auto& d : device_names(devices)) f["devices"].push_back(device_facts(d));
  return f;
}

json port_counters(const std::vector<std::string>& devices) {
  json c = json::object();
  for (auto& d : device_names(devices))
    for (auto& p : list_dir("/sys/class/infiniband/" + d + "/ports"))
      c[d + "/" + p] = counters_of(d, std::atoi(p.c_str()));
  return c;
}

std::vector<PortRef> rails(const json& facts) {
  std::vector<PortRef> out;
  for (auto& d : facts.value("devices", json::array())) {
    auto ports = d.value("ports", json::array());
    if (ports.empty()) {
      out.push_back({d.value("name", "?"), 1, -1, "", false});
      continue;
    }
    auto& p = ports[0];
    out.push_back({d.value("name", "?"), p.value("port", 1), p.value("gid_index", -1),
                   p.value("ipv4", ""), p.value("state", "") == "ACTIVE"});
  }
  return out;
}

}  // namespace audit

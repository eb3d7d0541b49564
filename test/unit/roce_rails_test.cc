// The rails a host has when nobody names them: the IPv4 addresses of the
// netdevs behind its active RoCE ports, read from a fake sysfs tree.
#include "core/roce_rails.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>

using namespace shunt;
namespace fs = std::filesystem;

namespace {

struct FakeSysfs {
  fs::path root;
  FakeSysfs() {
    char t[] = "/tmp/shunt-sysfs-XXXXXX";
    root = mkdtemp(t);
  }
  ~FakeSysfs() { fs::remove_all(root); }
  void put(const fs::path& rel, const std::string& line) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << line << "\n";
  }
  // One port of a device with its state and GID entries (index -> gid, type, netdev).
  struct Gid {
    int index;
    std::string gid, type, ndev;
  };
  void port(const std::string& dev, int port, const std::string& state,
            const std::vector<Gid>& gids) {
    fs::path p = fs::path(dev) / "ports" / std::to_string(port);
    put(p / "state", state);
    put(p / "link_layer", "Ethernet");
    for (auto& g : gids) {
      put(p / "gids" / std::to_string(g.index), g.gid);
      put(p / "gid_attrs/types" / std::to_string(g.index), g.type);
      put(p / "gid_attrs/ndevs" / std::to_string(g.index), g.ndev);
    }
  }
};

const std::string kLinkLocal = "fe80:0000:0000:0000:0250:56ff:fe00:0001";
std::string v4(const char* hex) {
  return std::string("0000:0000:0000:0000:0000:ffff:") + hex;
}

// Two RoCE ports with IPv4 GIDs, a port that is DOWN, an InfiniBand-style
// port (no RoCE type), an unused GID slot: only the two are rails.
void typical_host(FakeSysfs& f) {
  f.port("mlx5_10", 1, "4: ACTIVE",
         {{0, kLinkLocal, "RoCE v2", "ens10"},
          {1, v4("0a00:0a02"), "IB/RoCE v1", "ens10"},
          {2, v4("0a00:0a02"), "RoCE v2", "ens10"}});
  f.port("mlx5_2", 1, "4: ACTIVE",
         {{0, kLinkLocal, "IB/RoCE v1", "ens2"},
          {3, v4("0a00:0202"), "RoCE v2", "ens2"},
          {4, "0000:0000:0000:0000:0000:0000:0000:0000", "", ""}});
  f.port("mlx5_3", 1, "1: DOWN", {{1, v4("0a00:0302"), "RoCE v2", "ens3"}});
  f.port("ib0dev", 1, "4: ACTIVE",
         {{0, "fe80:0000:0000:0000:0002:c903:0001:0002", "IB/RoCE v1", ""}});
}

Config with(std::map<Param, std::string> vals) {
  Config c;
  for (auto& [p, v] : vals) {
    ConfigError e;
    EXPECT_TRUE(c.set(p, v, "test", &e)) << e.message;
  }
  return c;
}

}  // namespace

TEST(RoceRails, ActiveRoceIpv4PortsInDeviceThenPortOrder) {
  FakeSysfs f;
  typical_host(f);
  int devices = 0;
  auto rails = roce_rails(f.root, &devices);
  EXPECT_EQ(devices, 4);
  ASSERT_EQ(rails.size(), 2u);
  // mlx5_2 before mlx5_10: device numbers compare as numbers.
  EXPECT_EQ(rails[0].device, "mlx5_2");
  EXPECT_EQ(rails[0].netdev, "ens2");
  EXPECT_EQ(rails[0].ip, "10.0.2.2");
  EXPECT_EQ(rails[1].device, "mlx5_10");
  EXPECT_EQ(rails[1].ip, "10.0.10.2");
}

TEST(RoceRails, OneRailPerNetdev) {
  FakeSysfs f;
  // A netdev with two addresses, and two ports behind one netdev (a bond):
  // one rail each, the first address.
  f.port("rxe0", 1, "4: ACTIVE",
         {{1, v4("0a00:0001"), "RoCE v2", "eth1"}, {2, v4("0a00:0009"), "RoCE v2", "eth1"}});
  f.port("rxe0", 2, "4: ACTIVE", {{1, v4("0a00:0101"), "RoCE v2", "bond0"}});
  f.port("rxe1", 1, "4: ACTIVE", {{1, v4("0a00:0101"), "RoCE v2", "bond0"}});
  auto rails = roce_rails(f.root);
  ASSERT_EQ(rails.size(), 2u);
  EXPECT_EQ(rails[0].ip, "10.0.0.1");
  EXPECT_EQ(rails[1].port, 2);
  EXPECT_EQ(rails[1].ip, "10.0.1.1");
}

TEST(RoceRails, NoDeviceNoRails) {
  int devices = -1;
  EXPECT_TRUE(roce_rails("/nonexistent-shunt-sysfs", &devices).empty());
  EXPECT_EQ(devices, 0);
}

TEST(RoceRails, ProbeRailsDefaultToTheRocePorts) {
  FakeSysfs f;
  typical_host(f);
  ProbeRails r = probe_rails(with({{Param::test_ib_sysfs, f.root}}));
  EXPECT_EQ(r.from, RailsFrom::roce_ports);
  EXPECT_EQ(r.addrs, (std::vector<std::string>{"10.0.2.2", "10.0.10.2"}));
}

TEST(RoceRails, NamedProbeAddrsWin) {
  FakeSysfs f;
  typical_host(f);
  ProbeRails r = probe_rails(
      with({{Param::test_ib_sysfs, f.root}, {Param::probe_addrs, "10.9.0.1,10.9.1.1"}}));
  EXPECT_EQ(r.from, RailsFrom::named);
  EXPECT_EQ(r.addrs, (std::vector<std::string>{"10.9.0.1", "10.9.1.1"}));
}

TEST(RoceRails, NoneTurnsDiscoveryOff) {
  FakeSysfs f;
  typical_host(f);
  ProbeRails r = probe_rails(with({{Param::test_ib_sysfs, f.root}, {Param::probe_addrs, "none"}}));
  EXPECT_EQ(r.from, RailsFrom::none);
  EXPECT_TRUE(r.addrs.empty());
  EXPECT_FALSE(probe_plan(r, true).start);
  EXPECT_EQ(probe_plan(r, true).message, "");  // asked for: nothing to say
}

TEST(ProbePlan, RailsAndKeyProbe) {
  ProbeRails r{{"10.0.0.1"}, RailsFrom::roce_ports, 1};
  ProbePlan p = probe_plan(r, true);
  EXPECT_TRUE(p.start);
  EXPECT_EQ(p.message, "");
}

TEST(ProbePlan, RailsWithoutKeyDoNotProbeAndSayWhatToSet) {
  ProbeRails r{{"10.0.0.1"}, RailsFrom::roce_ports, 1};
  ProbePlan p = probe_plan(r, false);
  EXPECT_FALSE(p.start);
  EXPECT_EQ(p.level, LogLevel::warn);
  EXPECT_NE(p.message.find("no probing"), std::string::npos) << p.message;
  EXPECT_NE(p.message.find("set SHUNT_JOB_KEY"), std::string::npos) << p.message;
}

TEST(ProbePlan, NoRdmaDeviceSaysWhatTheSocketsDoAtInfo) {
  ProbeRails r{{}, RailsFrom::roce_ports, 0};
  ProbePlan p = probe_plan(r, true);
  EXPECT_FALSE(p.start);
  EXPECT_EQ(p.level, LogLevel::info);
  EXPECT_NE(p.message.find("no RDMA device"), std::string::npos) << p.message;
  EXPECT_NE(p.message.find("MPTCP"), std::string::npos) << p.message;
  EXPECT_NE(p.message.find("SHUNT_SOCKET_RAILS"), std::string::npos) << p.message;
}

// shunt-audit's probe mesh judgement: loss per path against the
// thresholds, lossy paths attributed to the link they share (from the
// sender's side, or the receiver's), and clocks against the fleet.
#include <gtest/gtest.h>

#include "tools/shunt-audit/mesh.h"

using namespace audit;
using nlohmann::json;

namespace {

const std::vector<std::string> kNames{"h1", "h2", "h3", "h4"};

std::string router(int host, int spine) {
  return "192.168." + std::to_string(host) + "." + std::to_string(2 + 4 * spine);
}

// Every ordered pair on both rails: the probe port's path, and one source
// path through each of two spines; no loss, 50 us one way.
Mesh healthy() {
  Mesh m;
  m.ran = true;
  m.seconds = 10;
  for (int r = 0; r < 2; r++)
    for (int a = 0; a < 4; a++)
      for (int b = 0; b < 4; b++) {
        if (a == b) continue;
        m.paths.push_back({a, b, r, "", 0, true, 0, 50});
        for (int s = 0; s < 2; s++)
          m.paths.push_back({a, b, r, router(a, s), 0xC001 + s, true, 0, 50});
      }
  m.clocks.assign(4, HostClock{true, 0, 20});
  m.clocks[1].offset_ms = 3;
  return m;
}

std::vector<std::string> bad(const Mesh& m, const MeshJudged& j) {
  std::vector<std::string> out;
  for (size_t i = 0; i < m.paths.size(); i++)
    if (j.loss[i] != Status::pass || j.owd[i] != Status::pass)
      out.push_back(kNames[m.paths[i].src] + "->" + kNames[m.paths[i].dst] + " rail " +
                    std::to_string(m.paths[i].rail) + " " + m.paths[i].router);
  return out;
}

}  // namespace

TEST(AuditMesh, AHealthyMeshPassesEveryPathAndClock) {
  Mesh m = healthy();
  MeshJudged j = judge_mesh(m, {}, kNames);
  EXPECT_TRUE(bad(m, j).empty());
  EXPECT_TRUE(j.links.empty());
  for (auto s : j.clock) EXPECT_EQ(s, Status::pass);
}

TEST(AuditMesh, LossIsJudgedAgainstTheThresholds) {
  Mesh m = healthy();
  m.paths[0].loss = 0.02;    // h1 -> h2, rail 0, probe port: one path of many
  m.paths[3].loss = 0.10;    // h1 -> h3, probe port
  m.paths[6].heard = false;  // h1 -> h4, probe port: nothing acknowledged
  MeshJudged j = judge_mesh(m, {}, kNames);
  EXPECT_EQ(j.loss[0], Status::warn);
  EXPECT_EQ(j.loss[3], Status::fail);
  EXPECT_EQ(j.loss[6], Status::fail);
  EXPECT_TRUE(j.links.empty()) << "three paths of different spines are no link";
}

TEST(AuditMesh, AnUplinkLosingBothWaysIsNamedAsThatLinkNotAsItsPairs) {
  Mesh m = healthy();
  // h3's rail-1 leaf <-> its second spine drops 2% both ways: every path
  // from h3 through that spine, and every path to h3 through it (named by
  // the sender's router for that spine), and the probe-port paths that
  // hash onto it.
  for (auto& p : m.paths) {
    if (p.rail != 1) continue;
    if ((p.src == 2 && p.router == router(2, 1)) || (p.dst == 2 && p.router == router(p.src, 1)))
      p.loss = 0.02;
    if (p.router.empty() && (p.src == 2 || p.dst == 2) && (p.src + p.dst) % 2) p.loss = 0.02;
  }
  MeshJudged j = judge_mesh(m, {}, kNames);
  ASSERT_EQ(j.links.size(), 1u) << testing::PrintToString(bad(m, j));
  EXPECT_EQ(j.links[0].host, 2);
  EXPECT_EQ(j.links[0].rail, 1);
  EXPECT_EQ(j.links[0].router, router(2, 1));
  EXPECT_EQ(j.links[0].status, Status::warn);
  EXPECT_DOUBLE_EQ(j.links[0].loss, 0.02);
  EXPECT_TRUE(bad(m, j).empty()) << testing::PrintToString(bad(m, j));
}

TEST(AuditMesh, AHostThatOthersLoseProbesToIsItsOwnLinkInbound) {
  Mesh m = healthy();
  for (auto& p : m.paths)
    if (p.rail == 0 && p.dst == 3) p.loss = 0.08;
  MeshJudged j = judge_mesh(m, {}, kNames);
  ASSERT_EQ(j.links.size(), 1u) << testing::PrintToString(bad(m, j));
  EXPECT_EQ(j.links[0].host, 3);
  EXPECT_TRUE(j.links[0].inbound);
  EXPECT_EQ(j.links[0].router, "");
  EXPECT_EQ(j.links[0].status, Status::fail);
  EXPECT_TRUE(bad(m, j).empty()) << testing::PrintToString(bad(m, j));
}

TEST(AuditMesh, LossTowardsAHostThroughOneSpineOnlyStaysWithItsPairs) {
  Mesh m = healthy();
  // Down from spine 0 to h4's leaf only: each sender loses on its one
  // path through that spine to h4, and each sender names that spine by a
  // different address; no link can be named, and no host either.
  for (auto& p : m.paths)
    if (p.rail == 0 && p.dst == 3 && p.router == router(p.src, 0)) p.loss = 0.08;
  MeshJudged j = judge_mesh(m, {}, kNames);
  EXPECT_TRUE(j.links.empty());
  EXPECT_EQ(bad(m, j).size(), 3u) << testing::PrintToString(bad(m, j));
}

TEST(AuditMesh, AHostLosingOnEveryPathIsItsOwnLinkNotASpines) {
  Mesh m = healthy();
  for (auto& p : m.paths)
    if (p.rail == 0 && p.src == 1) p.loss = 0.03;
  MeshJudged j = judge_mesh(m, {}, kNames);
  ASSERT_EQ(j.links.size(), 1u);
  EXPECT_EQ(j.links[0].host, 1);
  EXPECT_EQ(j.links[0].router, "");
  EXPECT_FALSE(j.links[0].inbound);
  EXPECT_TRUE(bad(m, j).empty()) << testing::PrintToString(bad(m, j));
}

TEST(AuditMesh, ASlowOneWayDelayWarnsBeyondTheSlack) {
  Mesh m = healthy();
  m.paths[1].owd_us = 5000;  // h1 -> h2 via its first spine: 100x the median
  Thresholds t;
  MeshJudged j = judge_mesh(m, t, kNames);
  EXPECT_EQ(j.owd[1], Status::fail);
  t.lat_slack_us = 10000;
  EXPECT_EQ(judge_mesh(m, t, kNames).owd[1], Status::pass);
}

TEST(AuditMesh, AClockFarFromTheFleetWarnsAndAnUnknownOneWarns) {
  Mesh m = healthy();
  m.clocks[2].offset_ms = 250;
  m.clocks[3].valid = false;
  MeshJudged j = judge_mesh(m, {}, kNames);
  EXPECT_EQ(j.clock[0], Status::pass);
  EXPECT_EQ(j.clock[1], Status::pass);
  EXPECT_EQ(j.clock[2], Status::warn) << j.clock_detail[2];
  EXPECT_EQ(j.clock[3], Status::warn);
  m.clocks[2].offset_ms = 120000;
  EXPECT_EQ(judge_mesh(m, {}, kNames).clock[2], Status::fail);
  m.clocks[2].offset_ms = 1;
  m.clocks[2].bound_us = 5000;
  EXPECT_EQ(judge_mesh(m, {}, kNames).clock[2], Status::warn);
  // A rough estimate (no clock model yet): its offset is judged, no bound.
  m.clocks[2].bound_us = -1;
  m.clocks[3] = {true, 2, -1};
  MeshJudged rough = judge_mesh(m, {}, kNames);
  EXPECT_EQ(rough.clock[2], Status::pass) << rough.clock_detail[2];
  EXPECT_EQ(rough.clock[3], Status::pass);
  m.clocks[3].offset_ms = 400;
  EXPECT_EQ(judge_mesh(m, {}, kNames).clock[3], Status::warn);
}

TEST(AuditMesh, TheTreeShowsTheLossyLinkBesideTheMeasurementsOnes) {
  Mesh m = healthy();
  for (auto& p : m.paths)
    if (p.rail == 1 && p.src == 2 && p.router == router(2, 1)) p.loss = 0.06;
  std::vector<json> facts(4, json{{"devices", json::array()}});
  Node root{"fleet"};
  Node& be = root.add({"Back-end network"});
  add_mesh_nodes(be, m, judge_mesh(m, {}, kNames), kNames, facts);
  root.roll_up();
  EXPECT_EQ(root.status, Status::fail);
  const Node* rail1 = nullptr;
  for (auto& c : be.children)
    if (c.name == "rail 1") rail1 = &c;
  ASSERT_NE(rail1, nullptr);
  ASSERT_EQ(rail1->children[1].name, "leaf-spine links");
  ASSERT_EQ(rail1->children[1].children.size(), 1u);
  EXPECT_EQ(rail1->children[1].children[0].name, "h3's leaf <-> " + router(2, 1));
  EXPECT_EQ(rail1->children[1].children[0].status, Status::fail);
  EXPECT_EQ(rail1->children[2].name, "probed paths");
  EXPECT_EQ(rail1->children[2].status, Status::pass);
  EXPECT_EQ(be.children.back().name, "clocks");
}

// When the sockets' rail steering looks again within a tick (a sock_diag
// dump each time): for a rail in service whose subflows may be stuck, and
// for a backup rail waiting out its hold; never for a rail held as backup
// because its probes are lost, however its subflows look.
#include <gtest/gtest.h>

#include "interpose/socket/subflow_watch.h"

using namespace shunt::sock;

namespace {
RailLook rail(bool backup, bool dead, int busy = 0, int backing_off = 0) {
  RailLook r;
  r.backup = backup;
  r.probes_dead = dead;
  r.health.busy = busy;
  r.health.backing_off = backing_off;
  return r;
}
}  // namespace

TEST(RailLook, QuietRailsNeedNoLook) {
  EXPECT_FALSE(look_again_soon({}));
  EXPECT_FALSE(look_again_soon({rail(false, false), rail(false, false)}));
}

TEST(RailLook, BusyOrBackingOffSubflowsOfARailInServiceAreWatched) {
  EXPECT_TRUE(look_again_soon({rail(false, false, 1), rail(false, false)}));
  EXPECT_TRUE(look_again_soon({rail(false, false), rail(false, false, 0, 1)}));
}

TEST(RailLook, ABackupRailWhoseProbesCameBackWaitsOutItsHold) {
  EXPECT_TRUE(look_again_soon({rail(true, false), rail(false, false)}));
}

TEST(RailLook, ARailLostForGoodIsLeftToTheProbes) {
  // The dark rail's subflows keep backing off for as long as TCP retries:
  // that alone must not keep the thread dumping 20 times a second.
  EXPECT_FALSE(look_again_soon({rail(true, true, 2, 2), rail(false, false)}));
  // The other rail's busy subflows are still watched.
  EXPECT_TRUE(look_again_soon({rail(true, true, 2, 2), rail(false, false, 1)}));
}

// A path's life (interpose/verbs/bundle/life.h): every state and event,
// against the four flags a path's life is also described by (down, on
// probation, renewed and unproven, stopped by a plan) and the rules the
// bundle's parts apply to them.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "interpose/verbs/bundle/life.h"

namespace shunt::verbs::bundle {
namespace {

struct Flags {
  bool down = false, probation = false, renewed = false, planned = false;
};

Flags flags_of(Life s) {
  return {is_down(s), on_probation(s), unproven(s), planned(s)};
}

// The state a set of flags describes. A down path's probation flag is
// never read, so any value of it names the same state; a path in service,
// off probation and still unproven is not a state a path can reach
// (reachable() says which are).
Life life_of(const Flags& f) {
  if (f.down) {
    if (f.planned) return f.renewed ? Life::stopped_unproven : Life::stopped;
    return f.renewed ? Life::failed_unproven : Life::failed;
  }
  if (f.probation) return f.renewed ? Life::probation : Life::checking;
  return Life::in_service;
}
bool reachable(const Flags& f) { return f.down || f.probation || !f.renewed; }

// The rules on the flags, as the bundle's parts applied them: path_failed,
// begin_move (planned), reset_half, probe, and the poll path's completion
// of a probe (never reached on a down path: its completions are dropped
// first). A renewal (back_in_service) is three steps: down cleared, the
// probe, then renewed = probation (renewal() below).
Flags apply(Flags f, LifeEvent e) {
  switch (e) {
    case LifeEvent::fail:
      if (!f.down) f.down = true;
      break;
    case LifeEvent::stop:
      if (!f.down) f.down = f.planned = true;
      break;
    case LifeEvent::reset:
      f.planned = false;
      break;
    case LifeEvent::renew:
      f.down = false;
      break;
    case LifeEvent::probe_sent:
      f.probation = true;
      break;
    case LifeEvent::probe_unsent:  // probation set, then cleared: cannot probe, trust it
      f.probation = false;
      break;
    case LifeEvent::probe_done:
      if (!f.down) f.probation = false, f.renewed = false;
      break;
  }
  return f;
}
Flags renewal(Flags f, LifeEvent probe) {
  f = apply(apply(f, LifeEvent::renew), probe);
  f.renewed = f.probation;
  return f;
}

const Life kAll[] = {Life::in_service, Life::checking,       Life::probation,       Life::failed,
                     Life::failed_unproven, Life::stopped, Life::stopped_unproven};
const LifeEvent kEvents[] = {LifeEvent::fail,       LifeEvent::stop,         LifeEvent::reset,     LifeEvent::renew,
                             LifeEvent::probe_sent, LifeEvent::probe_unsent, LifeEvent::probe_done};

TEST(BundleLife, EveryStateIsNamedOnceAndItsFlagsNameItBack) {
  static_assert(sizeof(kAll) / sizeof(kAll[0]) == kLives);
  static_assert(sizeof(kEvents) / sizeof(kEvents[0]) == kLifeEvents);
  std::set<std::string> names;
  for (Life s : kAll) {
    names.insert(life_name(s));
    EXPECT_EQ(life_of(flags_of(s)), s) << life_name(s);
    EXPECT_TRUE(reachable(flags_of(s))) << life_name(s);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kLives));
}

TEST(BundleLife, EveryTransitionIsWhatTheFlagsRulesMake) {
  int unreached = 0;
  for (Life s : kAll)
    for (LifeEvent e : kEvents) {
      if (e == LifeEvent::renew) continue;  // only as a whole renewal, below
      Flags f = apply(flags_of(s), e);
      if (!reachable(f)) {
        // A probe that cannot be posted on a path already on probation:
        // probe() is never called on one (probe_all and answering skip
        // them, back_in_service sets renewed from its outcome).
        EXPECT_EQ(s, Life::probation);
        EXPECT_EQ(e, LifeEvent::probe_unsent);
        unreached++;
        continue;
      }
      Life want = life_of(f);
      EXPECT_EQ(next(s, e), want) << life_name(s) << " event " << static_cast<int>(e) << ": " << life_name(next(s, e))
                                  << ", the flags say " << life_name(want);
    }
  EXPECT_EQ(unreached, 1);
}

TEST(BundleLife, ARenewalEndsOnProbationOrTrustedAsTheFlagsSay) {
  for (Life s : kAll) {
    EXPECT_EQ(next(next(s, LifeEvent::renew), LifeEvent::probe_sent), life_of(renewal(flags_of(s), LifeEvent::probe_sent)))
        << life_name(s);
    EXPECT_EQ(next(next(s, LifeEvent::renew), LifeEvent::probe_sent), Life::probation) << life_name(s);
    EXPECT_EQ(next(next(s, LifeEvent::renew), LifeEvent::probe_unsent),
              life_of(renewal(flags_of(s), LifeEvent::probe_unsent)))
        << life_name(s);
    EXPECT_EQ(next(next(s, LifeEvent::renew), LifeEvent::probe_unsent), Life::in_service) << life_name(s);
  }
}

TEST(BundleLife, OnlyTheProbeOfARenewalBringsAPathUp) {
  // The poll path reports a path up when its probe completes while it is
  // unproven: after a renewal, never after a check of a path in service.
  EXPECT_TRUE(unproven(Life::probation));
  EXPECT_FALSE(unproven(Life::checking));
  EXPECT_EQ(next(Life::probation, LifeEvent::probe_done), Life::in_service);
  EXPECT_EQ(next(Life::checking, LifeEvent::probe_done), Life::in_service);
  // A failure on probation keeps the renewal unproven (its damping grows).
  EXPECT_EQ(next(Life::probation, LifeEvent::fail), Life::failed_unproven);
  EXPECT_EQ(next(Life::failed_unproven, LifeEvent::reset), Life::failed_unproven);
}

TEST(BundleLife, APathDownLeavesOnlyByARenewal) {
  for (Life s : kAll) {
    if (!is_down(s)) continue;
    for (LifeEvent e : kEvents) {
      if (e == LifeEvent::renew) continue;
      EXPECT_TRUE(is_down(next(s, e))) << life_name(s) << " event " << static_cast<int>(e);
    }
  }
}

}  // namespace
}  // namespace shunt::verbs::bundle

// A move of the carrier (interpose/verbs/bundle/move.h): every state and
// event, against the three flags a move was also described by (moving,
// need_move, gave_up) and the rules the bundle's parts applied to them.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "interpose/verbs/bundle/move.h"

namespace shunt::verbs::bundle {
namespace {

struct Flags {
  bool moving = false, need_move = false, gave_up = false;
};

Flags flags_of(Move s) {
  switch (s) {
    case Move::idle: return {false, false, false};
    case Move::needed: return {true, true, false};
    case Move::moving: return {true, false, false};
    case Move::gave_up: return {false, false, true};  // give_up cleared moving
  }
  return {};
}

// The state a set of flags describes. Once gave_up is set nothing reads
// moving or need_move (every reader looks at gave_up first, or the worker
// returns), so any value of them names the same state; need_move without
// moving is not a state a bundle can reach: it was set only with moving,
// or (retried) while moving was set, and moving cleared only with it.
Move move_of(const Flags& f) {
  if (f.gave_up) return Move::gave_up;
  if (f.moving) return f.need_move ? Move::needed : Move::moving;
  return Move::idle;
}
bool reachable(const Flags& f) { return f.gave_up || f.moving || !f.need_move; }

// The rules on the flags, as the bundle's parts applied them: path_failed
// on the carrier, answer_carrier_down, do_move's planned move not agreed
// and report_round's peer out of reach, report_round's ask, begin_move,
// move_sends (its new carrier up; down: done_onto() below), give_up.
Flags apply(Flags f, MoveEvent e) {
  switch (e) {
    case MoveEvent::fail:
      if (!f.moving) f.moving = f.need_move = true;
      break;
    case MoveEvent::peer_down:
      f.moving = f.need_move = true;
      break;
    case MoveEvent::retry:
      f.need_move = true;
      break;
    case MoveEvent::asked:
      f.need_move = false;
      break;
    case MoveEvent::start:
      f.moving = true;
      break;
    case MoveEvent::done:
      f.moving = f.need_move = false;
      break;
    case MoveEvent::give_up:
      if (!f.gave_up) f.gave_up = true, f.moving = false;
      break;
  }
  return f;
}
// move_sends: moving = need_move = whether the new carrier is down.
Flags done_onto(Flags f, bool down) {
  f.moving = f.need_move = down;
  return f;
}

const Move kAll[] = {Move::idle, Move::needed, Move::moving, Move::gave_up};
const MoveEvent kEvents[] = {MoveEvent::fail,  MoveEvent::peer_down, MoveEvent::retry,  MoveEvent::asked,
                             MoveEvent::start, MoveEvent::done,      MoveEvent::give_up};

std::string what(Move s, MoveEvent e) {
  return std::string(move_name(s)) + " event " + std::to_string(static_cast<int>(e));
}

TEST(BundleMove, EveryStateIsNamedOnceAndItsFlagsNameItBack) {
  static_assert(sizeof(kAll) / sizeof(kAll[0]) == kMoves);
  static_assert(sizeof(kEvents) / sizeof(kEvents[0]) == kMoveEvents);
  std::set<std::string> names;
  for (Move s : kAll) {
    names.insert(move_name(s));
    EXPECT_EQ(move_of(flags_of(s)), s) << move_name(s);
    EXPECT_TRUE(reachable(flags_of(s))) << move_name(s);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kMoves));
}

TEST(BundleMove, EveryTransitionIsWhatTheFlagsRulesMake) {
  int unreached = 0;
  for (Move s : kAll)
    for (MoveEvent e : kEvents) {
      Flags f = apply(flags_of(s), e);
      if (!reachable(f)) {
        // A retry while idle: do_move retries a planned move it started
        // itself (moving set under move_mu, which the move that would clear
        // it needs too), report_round only while its carrier is the one it
        // asked about (a move done since changed it).
        EXPECT_EQ(s, Move::idle);
        EXPECT_EQ(e, MoveEvent::retry);
        EXPECT_EQ(next(s, e), Move::needed);  // as the peer's carrier-down would
        unreached++;
        continue;
      }
      Move want = move_of(f);
      EXPECT_EQ(next(s, e), want) << what(s, e) << ": " << move_name(next(s, e)) << ", the flags say "
                                  << move_name(want);
    }
  EXPECT_EQ(unreached, 1);
}

// Every combination of the flags the old code could reach, not only those
// flags_of() names: after gave_up, moving and need_move could still be set
// (give_up left need_move; carrier-down or begin_move racing it set both).
TEST(BundleMove, EveryReachableFlagCombinationMovesAsItsState) {
  int combos = 0;
  for (int bits = 0; bits < 8; bits++) {
    Flags f{(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0};
    if (!reachable(f)) continue;
    combos++;
    for (MoveEvent e : kEvents) {
      Flags g = apply(f, e);
      if (!reachable(g)) continue;  // the retry while idle, above
      EXPECT_EQ(next(move_of(f), e), move_of(g)) << "flags " << bits << " event " << static_cast<int>(e);
    }
  }
  EXPECT_EQ(combos, 7);
}

TEST(BundleMove, TheReadersSeeWhatTheFlagsSaid) {
  // Two-sided work waited on moving; the worker acted on need_move; both
  // were read only while gave_up was clear.
  for (int bits = 0; bits < 4; bits++) {
    Flags f{(bits & 1) != 0, (bits & 2) != 0, false};
    if (!reachable(f)) continue;
    EXPECT_EQ(two_sided_waits(move_of(f)), f.moving) << bits;
    EXPECT_EQ(move_of(f) == Move::needed, f.need_move) << bits;
  }
  // steering and a planned do_move: nothing under way, needed or given up.
  for (Move s : kAll) {
    Flags f = flags_of(s);
    EXPECT_EQ(s != Move::idle, f.moving || f.need_move || f.gave_up) << move_name(s);
  }
  EXPECT_FALSE(two_sided_waits(Move::gave_up));  // bundle_carrier_for_test: the carrier, as moving was cleared
}

TEST(BundleMove, MoveSendsEndsIdleOrNeededAsTheNewCarrierIs) {
  for (Move s : kAll)
    for (bool down : {false, true}) {
      Move got = next(s, MoveEvent::done);
      if (down) got = next(got, MoveEvent::fail);
      EXPECT_EQ(got, move_of(done_onto(flags_of(s), down))) << move_name(s) << (down ? " onto a failed one" : "");
    }
  EXPECT_EQ(next(next(Move::moving, MoveEvent::done), MoveEvent::fail), Move::needed);
}

TEST(BundleMove, AFailoverAtTheDecidingEnd) {
  // path_failed (or the peer's carrier-down), then do_move: begin_move,
  // prepare, move_sends. Needed until done: a carrier-down meanwhile changes nothing.
  Move s = next(Move::idle, MoveEvent::fail);
  EXPECT_EQ(s, Move::needed);
  EXPECT_TRUE(two_sided_waits(s));
  s = next(s, MoveEvent::start);
  EXPECT_EQ(s, Move::needed);
  EXPECT_EQ(next(s, MoveEvent::peer_down), Move::needed);
  EXPECT_EQ(next(s, MoveEvent::done), Move::idle);
  EXPECT_EQ(next(Move::idle, MoveEvent::peer_down), Move::needed);
}

TEST(BundleMove, AFailoverAtTheAnsweringEnd) {
  // path_failed, the worker's carrier-down, then the peer's prepare and commit.
  Move s = next(Move::idle, MoveEvent::fail);
  s = next(s, MoveEvent::asked);
  EXPECT_EQ(s, Move::moving);
  EXPECT_TRUE(two_sided_waits(s));
  EXPECT_EQ(next(s, MoveEvent::retry), Move::needed);  // the peer not reached: asked again
  EXPECT_EQ(next(s, MoveEvent::fail), Move::moving);   // the stopped carrier's errors change nothing
  s = next(s, MoveEvent::start);
  EXPECT_EQ(s, Move::moving);
  EXPECT_EQ(next(s, MoveEvent::done), Move::idle);
}

TEST(BundleMove, APlannedMove) {
  // Steering stops a live carrier; where the peer does not agree, it moves
  // as after a failure; a carrier-down from the peer meanwhile does the same.
  Move s = next(Move::idle, MoveEvent::start);
  EXPECT_EQ(s, Move::moving);
  EXPECT_EQ(next(s, MoveEvent::done), Move::idle);
  EXPECT_EQ(next(s, MoveEvent::retry), Move::needed);
  EXPECT_EQ(next(s, MoveEvent::peer_down), Move::needed);
}

TEST(BundleMove, GivingUpIsTheEnd) {
  for (Move s : kAll) EXPECT_EQ(next(s, MoveEvent::give_up), Move::gave_up) << move_name(s);
  for (MoveEvent e : kEvents) EXPECT_EQ(next(Move::gave_up, e), Move::gave_up) << static_cast<int>(e);
}

}  // namespace
}  // namespace shunt::verbs::bundle

// A move of the carrier (the path of two-sided work: the application's QP
// until it fails, then a shadow agreed with the peer): where a bundle
// stands in one, as states and events with one pure transition function.
// Bundle::move holds it, under Bundle::lk. Where the carrier goes, and
// where receives go meanwhile, are Bundle::carrier, rcarrier and
// pending_from: data, not states.
#pragma once
#include <cstdint>

namespace shunt::verbs::bundle {

enum class Move : uint8_t {
  idle,     // no move: the carrier takes two-sided work
  needed,   // the carrier failed (here, or the peer says so), or a move is to be tried again:
            // two-sided work is held, and the worker decides the move (the deciding end)
            // or asks the peer for it with carrier-down (the answering end)
  moving,   // under way: this end stopped the carrier (begin_move), or asked the peer for the
            // move and waits for its carrier-prepare; two-sided work is held, the worker
            // has nothing to do for it until it is done or needed again
  gave_up,  // no path carries the work: the application got its errors; the end
};
inline constexpr int kMoves = 4;

enum class MoveEvent : uint8_t {
  fail,       // the carrier failed here (path_failed), or a move's new carrier had failed
              // when it took over; a move already under way goes on
  peer_down,  // the peer says the carrier failed (carrier-down)
  retry,      // to try again: a planned move the peer did not agree to after the carrier
              // stopped, or the peer not reached with carrier-down
  asked,      // the answering end asks the peer for the move (carrier-down)
  start,      // the carrier stops: to the error state, its completions drained (begin_move)
  done,       // the new carrier takes two-sided work (move_sends)
  give_up,    // nothing can carry the work (give_up)
};
inline constexpr int kMoveEvents = 7;

// The state after event e in state s; an event that does not apply leaves
// the state as it is. Nothing leaves gave_up.
Move next(Move s, MoveEvent e);

// Two-sided work waits (is held) for the move: the carrier takes none.
inline bool two_sided_waits(Move s) { return s == Move::needed || s == Move::moving; }
const char* move_name(Move s);

}  // namespace shunt::verbs::bundle

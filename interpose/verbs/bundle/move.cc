// A move of the carrier: the pure transition function (move.h).
#include "interpose/verbs/bundle/move.h"

namespace shunt::verbs::bundle {

Move next(Move s, MoveEvent e) {
  using M = Move;
  if (s == M::gave_up) return s;  // the end
  switch (e) {
    case MoveEvent::fail:  // a move already needed or under way goes on
      return s == M::idle ? M::needed : s;
    case MoveEvent::peer_down:
      return M::needed;
    case MoveEvent::retry:  // (never while idle: retried is what had started)
      return M::needed;
    case MoveEvent::asked:
      return s == M::needed ? M::moving : s;
    case MoveEvent::start:  // a move needed stays needed until done
      return s == M::idle ? M::moving : s;
    case MoveEvent::done:
      return M::idle;
    case MoveEvent::give_up:
      return M::gave_up;
  }
  return s;
}

const char* move_name(Move s) {
  switch (s) {
    case Move::idle: return "idle";
    case Move::needed: return "needed";
    case Move::moving: return "moving";
    case Move::gave_up: return "gave up";
  }
  return "?";
}

}  // namespace shunt::verbs::bundle

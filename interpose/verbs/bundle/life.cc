// A path's life: the pure transition function (life.h).
#include "interpose/verbs/bundle/life.h"

namespace shunt::verbs::bundle {

Life next(Life s, LifeEvent e) {
  using L = Life;
  switch (e) {
    case LifeEvent::fail:  // a path already down stays as it is
      if (s == L::in_service || s == L::checking) return L::failed;
      if (s == L::probation) return L::failed_unproven;
      return s;
    case LifeEvent::stop:
      if (s == L::in_service || s == L::checking) return L::stopped;
      if (s == L::probation) return L::stopped_unproven;
      return s;
    case LifeEvent::reset:  // a stopped path is renewed as a failed one
      if (s == L::stopped) return L::failed;
      if (s == L::stopped_unproven) return L::failed_unproven;
      return s;
    case LifeEvent::renew:
      return L::probation;
    case LifeEvent::probe_sent:
      if (s == L::in_service) return L::checking;
      return s;
    case LifeEvent::probe_unsent:
    case LifeEvent::probe_done:
      if (s == L::checking || s == L::probation) return L::in_service;
      return s;
  }
  return s;
}

const char* life_name(Life s) {
  switch (s) {
    case Life::in_service: return "in service";
    case Life::checking: return "checking";
    case Life::probation: return "probation";
    case Life::failed: return "failed";
    case Life::failed_unproven: return "failed unproven";
    case Life::stopped: return "stopped";
    case Life::stopped_unproven: return "stopped unproven";
  }
  return "?";
}

}  // namespace shunt::verbs::bundle

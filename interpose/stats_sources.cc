#include "interpose/stats_sources.h"

#include "interpose/socket/stats_source.h"
#include "interpose/verbs/stats_source.h"

namespace shunt {

void register_stats_sources() {
  verbs::register_stats();
  sock::register_stats();
}

}  // namespace shunt

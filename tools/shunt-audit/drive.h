// The driver (the first host of --hosts): gathers every host's facts,
// measures the back-end pair by pair, judges, prints the tree, writes the
// reports and tells every instance the verdict. Returns the exit status.
#pragma once
#include "peer/wire.h"
#include "tools/shunt-audit/options.h"

namespace audit {

int drive(const Options& o, const shunt::peer::Key& key);

}  // namespace audit

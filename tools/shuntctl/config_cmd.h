// `shuntctl config`: every variable of the registry with its default, the
// value in force for a process started with this environment, and help.
#pragma once
#include <ostream>

namespace shunt::ctl {

enum class ConfigFormat { table, json, markdown, man };
// Returns the exit status: 0, or 1 when a value in force is invalid.
int print_config(std::ostream& out, ConfigFormat fmt);

}  // namespace shunt::ctl

// JSON to text for values that may hold bytes from outside the process
// (environment, paths, peers' and reports' strings). nlohmann's dump()
// throws on a string that is not valid UTF-8 (type_error.316), which ends
// the process where nothing catches it: dumps of such values go through
// to_text, which writes those bytes as U+FFFD.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace shunt {

// j.dump(indent) that never throws on invalid UTF-8.
std::string to_text(const nlohmann::json& j, int indent = -1);

// s with each byte that is not part of a well-formed UTF-8 sequence
// replaced by U+FFFD: for strings from outside put into JSON values (so
// that any dump of them holds) and into metric labels.
std::string valid_utf8(std::string_view s);

// The length of the well-formed UTF-8 sequence at the start of s (1 to 4),
// or 0 when its first byte begins none.
size_t utf8_sequence(std::string_view s);

// How deep the arrays and objects of JSON text nest, outside its strings.
// Checked before parsing: copying or destroying a parsed value recurses once
// per level, so a deep enough request would overflow the stack.
int json_nesting(std::string_view text);

}  // namespace shunt

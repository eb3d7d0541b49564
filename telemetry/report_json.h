// Reading the member processes' reports (and the agent's answers built from
// them): other processes' JSON, read without trusting a type. A field that
// is missing or of another type reads as empty, never throws.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace shunt::telemetry::reports {

// "1.2.3.4:80" or "[::1]:80" -> the address
std::string host_of(const std::string& addr);
// The field, or null.
const nlohmann::json& at(const nlohmann::json& j, const char* key);
// A count: negative, NaN or not a number reads 0; too large, UINT64_MAX.
uint64_t count(const nlohmann::json& v);
uint64_t u64(const nlohmann::json& j, const char* key);
std::string str(const nlohmann::json& j, const char* key);
bool flag(const nlohmann::json& j, const char* key);
double real(const nlohmann::json& j, const char* key, double dflt);
// The members of an array, or nothing.
const nlohmann::json& list(const nlohmann::json& j, const char* key);
// The (key, value) pairs of an object, or nothing.
const nlohmann::json& dict(const nlohmann::json& j, const char* key);

}  // namespace shunt::telemetry::reports

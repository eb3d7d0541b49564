// The exit codes every shunt command shares, and a CLI11 parse that keeps
// to them: CLI11's own codes (106, 109, ...) name its internal error
// classes and would collide with a command's real results.
//   0   done
//   1   ran, and the result is a failure (wrong data, the agent said no)
//   2   could not run (no agent, a transport or setup error)
//   64  bad command line (EX_USAGE, sysexits.h)
#pragma once
#include <CLI/CLI.hpp>

namespace shunt::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitError = 2;
constexpr int kExitUsage = 64;

// Parses argv; -1 to go on, else the status to exit with (0 after --help
// or --version, kExitUsage after a usage error, explained on stderr).
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  return -1;
}

}  // namespace shunt::cli

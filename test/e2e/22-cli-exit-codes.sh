#!/usr/bin/env bash
# Every command line tool keeps to the documented exit codes: --help and
# --version exit 0 (the version names the tool and VERSION), a bad option or
# subcommand is a usage error, 64 (EX_USAGE), never a parser's internal
# code; each has a man page with an EXIT STATUS section that says 64.
# timeout: 60
. "$(dirname "$0")/../lib.sh"
ver=$(cat "$ROOT/VERSION")

# status CMD...: the exit status, output dropped
status() { "$@" >/dev/null 2>&1; echo $?; }

for t in shuntctl shunt-run shunt-bench shunt-fabric shunt-probe shunt-peer shunt-audit; do
  bin=$B/bin/$t
  [ -x "$bin" ] || fail "$t not built"
  expect_eq "$("$bin" --version 2>&1)" "$t $ver" "$t --version"
  expect_eq "$(status "$bin" --version)" 0 "$t --version status"
  expect_eq "$(status "$bin" --help)" 0 "$t --help status"
  expect_eq "$(status "$bin" --no-such-option)" 64 "$t --no-such-option status"
  page=$ROOT/man/$t.1
  [ -f "$page" ] || fail "no man page $page"
  sed -n '/^\.Sh EXIT STATUS/,/^\.Sh /p' "$page" | grep -qw 64 || fail "$t.1: EXIT STATUS does not mention 64"
  mandoc -T lint -W warning "$page" >"$TMP/lint" 2>&1 || { cat "$TMP/lint"; fail "$t.1: mandoc lint"; }
done

# Subcommands: unknown or missing is a usage error.
for t in shuntctl shunt-fabric shunt-peer; do
  expect_eq "$(status "$B/bin/$t" bogus)" 64 "$t bogus"
done
expect_eq "$(status "$B/bin/shuntctl")" 64 "shuntctl without a subcommand"
expect_eq "$(status "$B/bin/shunt-run")" 64 "shunt-run without a command"
expect_eq "$(status "$B/bin/shunt-run" --lib)" 64 "shunt-run --lib without a path"
expect_eq "$(status "$B/bin/shunt-run" --lib /nonexistent/libshunt.so true)" 127 "shunt-run, library missing"
expect_eq "$(status "$B/bin/shunt-bench" --transport carrier-pigeon)" 64 "shunt-bench bad --transport"
expect_eq "$(status "$B/bin/shunt-bench" scenario no-such-scenario)" 64 "shunt-bench scenario with a bad name"
expect_eq "$(status "$B/bin/shunt-probe" --listen not-an-address --duration 0.1)" 64 "shunt-probe bad --listen"
# 2: could not run (no agent listening for shuntctl, no job key for shunt-peer)
expect_eq "$(SHUNT_RUN_DIR=$TMP/none status "$B/bin/shuntctl" status)" 2 "shuntctl status, no agent"
expect_eq "$(env -u SHUNT_JOB_KEY bash -c '"$0" ping 127.0.0.1 >/dev/null 2>&1; echo $?' "$B/bin/shunt-peer")" 2 \
  "shunt-peer without SHUNT_JOB_KEY"

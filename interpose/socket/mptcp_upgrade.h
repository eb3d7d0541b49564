// TCP sockets opened as MPTCP (SHUNT_SOCKETS=mptcp). The kernel falls back to
// plain TCP by itself when the peer has no MPTCP; what is left to shunt is a
// kernel without MPTCP (pass through, say so once) and the socket options an
// MPTCP socket refuses where a TCP one accepts them (the application must
// never see a new error: see mptcp_setsockopt_fallback).
#pragma once
#include <sys/socket.h>

#include "interpose/socket/fd_table.h"

namespace shunt::sock {

#ifndef IPPROTO_MPTCP
constexpr int kProtoMptcp = 262;
#else
constexpr int kProtoMptcp = IPPROTO_MPTCP;
#endif
#ifndef SOL_MPTCP
constexpr int kSolMptcp = 284;
#else
constexpr int kSolMptcp = SOL_MPTCP;
#endif

enum class SocketsMode { mptcp, observe, off };
SocketsMode sockets_mode();

// True while socket() should try IPPROTO_MPTCP first (mode, kernel support).
bool upgrade_wanted();
// socket(IPPROTO_MPTCP) failed with `err`: a kernel without MPTCP (or with
// net.mptcp.enabled=0) turns upgrading off for the process, said once.
void upgrade_failed(int err);
uint64_t upgraded_count();
void count_upgrade();

// Remembers an option the application set on an upgraded socket that is not
// connected yet, so a downgrade can replay it.
void remember_option(SocketRecord* r, int level, int name, const void* val, socklen_t len);
// The real setsockopt failed with `err` on an upgraded socket. Returns what
// the application gets: the option applied to a plain TCP socket put in
// place of the MPTCP one (still unconnected, unbound), or, on a connected or
// bound socket, success with the option kept aside (logged once per option).
int mptcp_setsockopt_fallback(SocketRecord* r, int fd, int level, int name, const void* val, socklen_t len,
                              int err);
// The real getsockopt failed with `err` on an upgraded socket: the value the
// application set and shunt kept aside, else a plain TCP socket's default.
int mptcp_getsockopt_fallback(SocketRecord* r, int fd, int level, int name, void* val, socklen_t* len, int err);
// The fd is being closed: forget what was kept for it.
void forget_options(int fd);

}  // namespace shunt::sock

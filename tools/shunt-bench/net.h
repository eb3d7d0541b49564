// Small blocking-socket helpers shared by the bootstrap and the tcp transport.
#pragma once
#include <sys/socket.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace bench {

// A transport or bootstrap failure: what failed and the status it reported.
struct BenchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Splits "HOST:PORT" or "[V6]:PORT".
void split_host_port(const std::string& hp, std::string* host, std::string* port);

// Listening socket on host:port (port "0" = any); returns the fd.
int listen_on(const std::string& host, const std::string& port, int backlog);
// Connects to host:port, retrying refused/unreachable until timeout_s.
int connect_to(const std::string& host, const std::string& port, double timeout_s);
// Accepts one connection, waiting at most timeout_s.
int accept_within(int lfd, double timeout_s);

// Reads/writes exactly n bytes; a timeout (no byte for timeout_s), EOF or
// error throws BenchError naming `what`.
void read_full(int fd, void* buf, size_t n, double timeout_s, const std::string& what);
void write_full(int fd, const void* buf, size_t n, const std::string& what);

// Numeric address and port of a socket's own end.
std::string local_host(int fd);
std::string local_port(int fd);

void set_nodelay(int fd);
void set_nonblocking(int fd);
std::string errno_text(int err);

}  // namespace bench

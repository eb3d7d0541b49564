// The host agent's side of the control socket: the connections, each a
// line at a time, with bounds that keep one client from holding up the
// others (agent/agent.cc answers the lines).
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace shunt::peer {

class ControlServer {
 public:
  // Clients served at once; when full, the one idle longest makes room,
  // so a status or a report is always served.
  static constexpr size_t kMaxClients = 256;
  // Each request line is through within this, and its answer within this
  // and 1 ms a KiB, or the client goes (shunt's own send a report and read
  // the answer within 1 s each).
  static constexpr int kClientMs = 2000;
  // New clients taken per round, far fewer than kMaxClients: one taken in
  // a round is read in the next at the latest, before others can evict it.
  static constexpr int kAcceptsPerRound = 32;
  // What the agent takes in one request line. A report is the longest:
  // about 200 bytes a socket, up to 2 KB an MPTCP one with 8 subflows,
  // 0.3-2 KB a QP; so 2,000 MPTCP sockets, or 20,000 others, with room.
  static constexpr size_t kMaxRequestLine = 4 << 20;
  // Partial lines and unsent answers of every client together (sixteen
  // reports of the longest kind at once).
  static constexpr size_t kMaxBuffered = 64 << 20;

  // One request line (no newline) from a client of that uid to its answer
  // line (with the newline).
  using Answer = std::function<std::string(const std::string& line, uid_t uid)>;

  // Serves `listen_fd` (a listening Unix stream socket, non-blocking).
  void start(int listen_fd) { listen_fd_ = listen_fd; }
  // Waits up to timeout_ms for connections and lines and answers them.
  // Only the agent's own uid and root are served.
  void serve(int timeout_ms, const Answer& answer);
  // The fork child's copies go, without a word to the clients.
  void forget();
  size_t clients() const { return clients_.size(); }

 private:
  struct Client {
    int fd;
    uid_t uid;
    std::string in, out;  // the request line so far; the answer not sent yet
    int64_t deadline_ms;  // the current request and its answer are through by then
    int64_t active_ms;    // when it last sent or took bytes
  };
  void take(int fd, int64_t now);
  void read(Client& c, int64_t now, const Answer& answer);
  void answer_lines(Client& c, int64_t now, const Answer& answer);
  bool flush(Client& c, int64_t now);
  void drop(Client& c);

  int listen_fd_ = -1;
  std::vector<Client> clients_;
  size_t buffered_ = 0;  // in and out of every client
};

}  // namespace shunt::peer

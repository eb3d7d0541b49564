// The metrics endpoint's HTTP/1.0 server: one thread, one poll loop, every
// client non-blocking. Each client has a deadline for its request head and
// one for taking its answer, a bounded head, and the table a bounded size
// (when full, the client waiting longest for its head gives way), so a
// scrape is answered while hundreds of idle connections are open. (It served
// one client at a time, each allowed 2 s: 500 idle connections made a
// scrape wait 14 s.)
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace shunt::telemetry {

struct HttpAnswer {
  std::string status = "200 OK", type = "text/plain", body;
};

class HttpServer {
 public:
  struct Limits {
    size_t max_clients = 64;  // connections held at once
    size_t max_head = 16384;  // bytes of a request head
    int64_t head_ms = 2000;   // from accept to a whole request head
    int64_t send_ms = 5000;   // from the head to the answer's last byte
  };
  // The answer to METHOD PATH (the target without its query).
  using Handler = std::function<HttpAnswer(const std::string& method, const std::string& path)>;

  // Serves the listening socket `listen_fd` (non-blocking; the caller's).
  HttpServer(int listen_fd, Handler handler, Limits limits);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Waits up to wait_ms for something to do, then does it: accepts,
  // reads heads, answers, sends, drops those past their deadline.
  void serve(int wait_ms);
  size_t clients() const { return clients_.size(); }

 private:
  struct Client {
    int fd;
    int64_t since, deadline;
    std::string in, out;  // the head so far; then the answer, from `sent` on
    size_t sent = 0;
    bool answering = false;
  };
  void accept_new(int64_t now_ms);
  void read_head(Client& c, int64_t now_ms);
  void send_some(Client& c);
  std::string answer(const std::string& head);

  int lfd_;
  Handler handler_;
  Limits limits_;
  std::vector<Client> clients_;
};

}  // namespace shunt::telemetry

// The handlers any holder of the job key reaches through the peer channel
// (a process's bundle_answer, the agent's peer_answer), fed what a client
// may send: every request gets an answer, none throws out.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "interpose/verbs/bundle.h"
#include "peer/session.h"

namespace shunt::agent {
nlohmann::json peer_answer(const nlohmann::json& req);  // peer_service.cc
}

namespace {
using nlohmann::json;
using namespace shunt;

// Requests of the wrong shape: the command, the QP's fields and the
// request id of another type, or no object at all.
std::vector<json> odd_requests() {
  std::vector<json> r = {json::parse(R"({"cmd":5})"), json::parse(R"({"cmd":null})"), json::parse(R"({"cmd":[1,2]})"),
                         json::parse(R"({"cmd":{"a":1}})"), json::parse(R"({"cmd":true})"), json::parse(R"({"cmd":-1.5})"),
                         json::object(), json::array({1, 2}), json("bundle-join"), json(nullptr), json(5),
                         json::parse(R"({"cmd":"ping","rid":"x"})"), json::parse(R"({"cmd":"locate","gid":5,"qpn":"x"})"),
                         json::parse(R"({"cmd":"locate","gid":"00","qpn":1e30})"),
                         json::parse(R"({"cmd":"locate","gid":"00","qpn":-1})"),
                         json::parse(R"({"cmd":"locate","gid":"00","qpn":99999999999})")};
  for (const char* c : {"bundle-join", "bundle-activate", "bundle-abort", "bundle-give-up", "carrier-down",
                        "carrier-prepare", "carrier-commit", "path-renew", "path-down", "steer-view", "bundle-rkeys",
                        "renew-now"}) {
    r.push_back({{"cmd", c}});
    r.push_back({{"cmd", c}, {"gid", 5}, {"qpn", "x"}, {"why", 1}, {"want", 5}, {"rid", 7}});
    r.push_back({{"cmd", c}, {"gid", "fe80"}, {"qpn", -1}, {"paths", "x"}, {"rails", {1, "a", nullptr}}});
  }
  return r;
}

TEST(PeerHandlers, BundleAnswerAnswersEveryMalformedRequestWithAnErrorOrARetry) {
  for (const json& req : odd_requests()) {
    json a;
    ASSERT_NO_THROW(a = verbs::bundle_answer(req)) << req.dump();
    EXPECT_TRUE(a.is_object() && (a.contains("error") || a.contains("retry"))) << req.dump() << " -> " << a.dump();
  }
}

TEST(PeerHandlers, ANumberForTheCommandIsAnUnknownCommand) {
  json a = verbs::bundle_answer(json::parse(R"({"cmd":5})"));
  EXPECT_EQ(a.value("error", ""), "unknown command ");
}

TEST(PeerHandlers, TheAgentsPeerAnswerAnswersEveryMalformedRequest) {
  for (const json& req : odd_requests()) {
    json a;
    ASSERT_NO_THROW(a = agent::peer_answer(req)) << req.dump();
    EXPECT_TRUE(a.is_object() && (a.contains("error") || a.contains("pong"))) << req.dump() << " -> " << a.dump();
  }
  EXPECT_EQ(agent::peer_answer({{"cmd", "ping"}}).value("pong", false), true);
  EXPECT_TRUE(agent::peer_answer({{"cmd", "locate"}, {"gid", "00"}, {"qpn", 7}}).contains("retry"));
}

// A session whose handshake is done, and a request through it.
struct Open {
  peer::Key k = peer::job_key_from("k");
  peer::ServerSession s{k, peer::random_nonce()};
  peer::ClientSession c{k, peer::random_nonce()};
  std::string why;
  bool handshake(const peer::RequestHandler& h) {
    std::vector<uint8_t> to_s, to_c = s.hello();
    for (int i = 0; i < 4 && !c.ready(); i++) {
      to_s.clear();
      if (!c.on_bytes(to_c.data(), to_c.size(), &to_s, &why)) return false;
      to_c.clear();
      if (!to_s.empty() && !s.on_bytes(to_s.data(), to_s.size(), h, &to_c, &why)) return false;
    }
    return c.ready();
  }
  json ask(const json& req, const peer::RequestHandler& h) {
    auto q = c.request(req);
    std::vector<uint8_t> rep;
    EXPECT_TRUE(s.on_bytes(q.data(), q.size(), h, &rep, &why)) << why;
    EXPECT_TRUE(c.on_bytes(rep.data(), rep.size(), nullptr, &why)) << why;
    return c.has_reply() ? c.take_reply() : json();
  }
};

TEST(PeerHandlers, AHandlerThatThrowsGetsAnErrorReplyAndTheSessionGoesOn) {
  Open o;
  peer::RequestHandler h = [](const json& r) -> json {
    if (r.value("throw", false)) throw std::runtime_error("boom");
    return {{"ok", true}};
  };
  ASSERT_TRUE(o.handshake(h)) << o.why;
  json a;
  ASSERT_NO_THROW(a = o.ask({{"throw", true}}, h));
  EXPECT_NE(a.value("error", "").find("boom"), std::string::npos) << a.dump();
  EXPECT_EQ(o.ask({{"throw", false}}, h), json({{"ok", true}}));
}

TEST(PeerHandlers, StringsOfAReplyThatAreNotUtf8ArriveReplaced) {
  Open o;
  peer::RequestHandler h = [](const json&) { return json{{"host", "h\xff"}}; };
  ASSERT_TRUE(o.handshake(h)) << o.why;
  json a;
  ASSERT_NO_THROW(a = o.ask({{"cmd", "ping"}}, h));
  EXPECT_EQ(a.value("host", ""), "h\xEF\xBF\xBD");
}

}  // namespace

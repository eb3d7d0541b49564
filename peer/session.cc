#include "peer/session.h"

#include <sodium.h>

#include <cstring>

#include "core/json_text.h"

namespace shunt::peer {

namespace {
using nlohmann::json;

constexpr int kMaxDepth = 16;

std::string hex(const uint8_t* p, size_t n) {
  static const char d[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; i++) s += d[p[i] >> 4], s += d[p[i] & 15];
  return s;
}

template <size_t N>
bool unhex(const json& j, const char* field, std::array<uint8_t, N>* out) {
  if (!j.is_object() || !j.contains(field) || !j[field].is_string()) return false;
  const std::string& s = j[field].get_ref<const std::string&>();
  if (s.size() != 2 * N) return false;
  for (size_t i = 0; i < N; i++) {
    auto v = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
    int hi = v(s[2 * i]), lo = v(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

void append(std::vector<uint8_t>* out, const std::vector<uint8_t>& v) { out->insert(out->end(), v.begin(), v.end()); }

// Pops the next complete frame from buf; 1 = frame, 0 = need more, -1 = drop.
int next_frame(std::vector<uint8_t>& buf, Frame* f, std::string* why) {
  size_t used = 0;
  switch (parse_frame(buf.data(), buf.size(), f, &used, why)) {
    case Parse::ok:
      buf.erase(buf.begin(), buf.begin() + static_cast<long>(used));
      return 1;
    case Parse::need_more:
      return 0;
    default:
      return -1;
  }
}
}  // namespace

ServerSession::ServerSession(const Key& job, const Nonce& s) : job_(job), nonce_s_(s) {}

std::vector<uint8_t> ServerSession::hello() const {
  Frame f;
  f.type = FrameType::hello;
  f.payload = to_text(json{{"nonce", hex(nonce_s_.data(), nonce_s_.size())}});
  return encode_frame(f, job_);
}

bool ServerSession::on_bytes(const uint8_t* p, size_t n, const RequestHandler& h, std::vector<uint8_t>* out,
                             std::string* why) {
  buf_.insert(buf_.end(), p, p + n);
  Frame f;
  for (;;) {
    int r = next_frame(buf_, &f, why);
    if (r <= 0) return r == 0;
    if (state_ == State::wait_auth) {
      if (f.type != FrameType::auth) return *why = "expected auth", false;
      if (!verify_frame(f, job_)) return *why = "wrong job key (auth MAC)", false;
      json j = json::parse(f.payload, nullptr, false);
      Nonce c;
      std::array<uint8_t, 32> proof;
      if (!unhex(j, "nonce", &c) || !unhex(j, "proof", &proof)) return *why = "malformed auth", false;
      auto want = client_proof(job_, nonce_s_, c);
      if (sodium_memcmp(want.data(), proof.data(), proof.size()) != 0) return *why = "wrong job key (proof)", false;
      session_ = session_key(job_, nonce_s_, c);
      auto sp = server_proof(job_, nonce_s_, c);
      Frame ok;
      ok.type = FrameType::auth_ok;
      ok.payload = to_text(json{{"proof", hex(sp.data(), sp.size())}});
      append(out, encode_frame(ok, job_));
      state_ = State::open;
      continue;
    }
    if (f.type != FrameType::request) return *why = "expected request", false;
    if (!verify_frame(f, session_)) return *why = "bad MAC", false;
    if (f.seq != seq_in_ + 1) return *why = "sequence " + std::to_string(f.seq) + " after " + std::to_string(seq_in_), false;
    seq_in_ = f.seq;
    const bool deep = json_nesting(f.payload) > kMaxDepth;
    json req = deep ? json() : json::parse(f.payload, nullptr, false);
    json ans;
    // The handler runs on the listener's thread: whatever it throws is the
    // request's error, never the end of the process.
    try {
      if (deep) ans = {{"error", "a request nests at most " + std::to_string(kMaxDepth) + " levels"}};
      else if (!req.is_object()) ans = {{"error", "a request is a JSON object"}};
      else ans = h(req);
    } catch (const std::exception& e) {
      ans = {{"error", std::string("cannot answer: ") + e.what()}};
    }
    Frame rep;
    rep.type = FrameType::reply;
    rep.seq = ++seq_out_;
    rep.payload = to_text(ans);
    if (rep.payload.size() > kMaxPayload) rep.payload = to_text(json{{"error", "reply too large"}});
    append(out, encode_frame(rep, session_));
  }
}

ClientSession::ClientSession(const Key& job, const Nonce& c) : job_(job), nonce_c_(c) {}

bool ClientSession::on_bytes(const uint8_t* p, size_t n, std::vector<uint8_t>* out, std::string* why) {
  buf_.insert(buf_.end(), p, p + n);
  Frame f;
  for (;;) {
    int r = next_frame(buf_, &f, why);
    if (r <= 0) return r == 0;
    switch (state_) {
      case State::wait_hello: {
        if (f.type != FrameType::hello) return *why = "expected hello", false;
        if (!unhex(json::parse(f.payload, nullptr, false), "nonce", &nonce_s_)) return *why = "malformed hello", false;
        auto proof = client_proof(job_, nonce_s_, nonce_c_);
        Frame a;
        a.type = FrameType::auth;
        a.payload = to_text(json{{"nonce", hex(nonce_c_.data(), nonce_c_.size())}, {"proof", hex(proof.data(), proof.size())}});
        append(out, encode_frame(a, job_));
        state_ = State::wait_auth_ok;
        break;
      }
      case State::wait_auth_ok: {
        if (f.type != FrameType::auth_ok || !verify_frame(f, job_)) return *why = "peer does not hold the job key", false;
        std::array<uint8_t, 32> proof;
        auto want = server_proof(job_, nonce_s_, nonce_c_);
        if (!unhex(json::parse(f.payload, nullptr, false), "proof", &proof) ||
            sodium_memcmp(want.data(), proof.data(), proof.size()) != 0)
          return *why = "peer does not hold the job key", false;
        session_ = session_key(job_, nonce_s_, nonce_c_);
        state_ = State::open;
        break;
      }
      case State::open: {
        if (f.type != FrameType::reply || !verify_frame(f, session_)) return *why = "bad reply MAC", false;
        if (f.seq != seq_in_ + 1) return *why = "reply out of sequence", false;
        seq_in_ = f.seq;
        reply_ = json::parse(f.payload, nullptr, false);
        if (reply_.is_discarded()) return *why = "malformed reply", false;
        has_reply_ = true;
        break;
      }
    }
  }
}

std::vector<uint8_t> ClientSession::request(const nlohmann::json& req) {
  Frame f;
  f.type = FrameType::request;
  f.seq = ++seq_out_;
  f.payload = to_text(req);
  return encode_frame(f, session_);
}

nlohmann::json ClientSession::take_reply() {
  has_reply_ = false;
  return std::move(reply_);
}

}  // namespace shunt::peer

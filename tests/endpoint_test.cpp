// Frame validation at the receiving end: a real Endpoint over one TCP-like socket whose other
// end the test writes by hand.
#include "transport/endpoint.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <thread>

#include "comm/op_code.h"
#include "common/error.h"
#include "transport/tcp/tcp_link.h"

namespace shoal::transport {
namespace {

using namespace std::chrono_literals;

struct Harness {
  std::unique_ptr<Endpoint> endpoint;
  Fd peer;  // the raw far end, playing rank 1
  Harness() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    std::vector<std::unique_ptr<Link>> links(2);
    links[1] = std::make_unique<tcp::TcpLink>(LinkContext{0, 1}, Fd(sv[0]));
    EndpointOptions options;
    options.describe = comm::describeOp;  // names frames the way groups do
    endpoint = std::make_unique<Endpoint>(0, 2, std::move(links), nullptr, options);
    peer = Fd(sv[1]);
  }
  void write(const void* p, size_t n) { writeAll(peer.get(), p, n, Deadline(1s), "test"); }
};

FrameHeader expected(uint64_t count) {
  FrameHeader h;
  h.op = static_cast<uint8_t>(comm::op::kAllreduce);
  h.dtype = static_cast<uint8_t>(DataType::kFloat32);
  h.group = 7;
  h.seq = 3;
  h.count = count;
  h.bytes = count * 4;
  return h;
}

// Receives one expected frame; returns the error text or "" on success.
template <typename E>
std::string recvExpecting(Harness& h, const FrameHeader& want, std::vector<float>& out,
                          Duration timeout = 2s) {
  auto t = Transfer::recv(1, want, out.data());
  try {
    h.endpoint->run(&t, 1, Deadline(timeout));
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

TEST(Endpoint, ValidFrameArrives) {
  Harness h;
  auto want = expected(4);
  std::vector<float> payload{1, 2, 3, 4}, out(4);
  h.write(&want, sizeof(want));
  h.write(payload.data(), 16);
  auto t = Transfer::recv(1, want, out.data());
  h.endpoint->run(&t, 1, Deadline(2s));
  EXPECT_EQ(out, payload);
}

TEST(Endpoint, GarbageIsAProtocolError) {
  Harness h;
  std::vector<uint8_t> junk(48, 0xab);
  h.write(junk.data(), junk.size());
  std::vector<float> out(4);
  auto msg = recvExpecting<ProtocolError>(h, expected(4), out);
  EXPECT_NE(msg.find("not a Shoal frame"), std::string::npos) << msg;
}

TEST(Endpoint, CountMismatchNamesBothSides) {
  Harness h;
  auto sent = expected(100);
  h.write(&sent, sizeof(sent));
  std::vector<float> out(77);
  auto msg = recvExpecting<MismatchError>(h, expected(77), out);
  EXPECT_NE(msg.find("77 x float32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100 x float32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("peer 1"), std::string::npos) << msg;
}

TEST(Endpoint, OversizedPayloadIsRejectedBeforeReading) {
  Harness h;
  auto sent = expected(4);
  sent.bytes = 1ull << 40;  // same count, absurd size: never allocated or read
  h.write(&sent, sizeof(sent));
  std::vector<float> out(4);
  auto msg = recvExpecting<ProtocolError>(h, expected(4), out);
  EXPECT_NE(msg.find("bytes"), std::string::npos) << msg;
}

TEST(Endpoint, TruncatedFrameIsAPeerError) {
  Harness h;
  auto sent = expected(4);
  h.write(&sent, 20);  // half a header, then the peer goes away
  h.peer.reset();
  std::vector<float> out(4);
  auto msg = recvExpecting<PeerError>(h, expected(4), out);
  EXPECT_NE(msg.find("closed by peer 1"), std::string::npos) << msg;
}

TEST(Endpoint, AbortFrameCarriesThePeersReason) {
  Harness h;
  FrameHeader a;
  a.kind = static_cast<uint8_t>(FrameKind::kAbort);
  a.abortKind = static_cast<uint8_t>(AbortKind::kMismatch);
  std::string text = "rank 3 disagrees";
  a.bytes = text.size();
  h.write(&a, sizeof(a));
  h.write(text.data(), text.size());
  std::vector<float> out(4);
  auto msg = recvExpecting<MismatchError>(h, expected(4), out);
  EXPECT_NE(msg.find("rank 3 disagrees"), std::string::npos) << msg;
}

TEST(Endpoint, SilentPeerTimesOutNamingItAndTheOperation) {
  Harness h;
  std::vector<float> out(4);
  auto t0 = Clock::now();
  auto msg = recvExpecting<TimeoutError>(h, expected(4), out, 300ms);
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_NE(msg.find("peer 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("allreduce #3"), std::string::npos) << msg;
}

TEST(Endpoint, AfterAbortEveryCallFailsAtOnceAndThePeerIsTold) {
  Harness h;
  h.endpoint->abort({AbortKind::kPeer, 0, "local failure"});
  FrameHeader got{};
  readAll(h.peer.get(), &got, sizeof(got), Deadline(1s), "test");
  EXPECT_EQ(got.kind, static_cast<uint8_t>(FrameKind::kAbort));
  std::vector<float> out(4);
  auto msg = recvExpecting<PeerError>(h, expected(4), out);
  EXPECT_NE(msg.find("local failure"), std::string::npos) << msg;
}

}  // namespace
}  // namespace shoal::transport

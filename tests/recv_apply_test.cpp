// Receive-apply (transport::Transfer::recvApply) over both transports, ranks as threads: the
// handler must see the whole payload exactly once, in order, in whole aligned grains, also when
// the payload arrives in many pieces (a shared-memory ring much smaller than the payload; TCP's
// staging) and when it starts at an offset that is not aligned to the grain (the staged path).
// And its companion sendAsReady: a reply that streams out as the handler produces it.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "comm/native/native_engine.h"
#include "common/error.h"
#include "tests/thread_ranks.h"

namespace shoal::test {
namespace {

using transport::PieceHandler;

struct Received {
  std::vector<uint8_t> bytes;  // the payload, rebuilt from the pieces
  size_t pieces = 0;
  size_t next = 0;  // the offset the next piece must start at
  size_t grain = 1;
  std::string error;  // the first broken promise
};

void collect(void* context, const void* data, size_t offset, size_t n) {
  auto& r = *static_cast<Received*>(context);
  if (r.error.empty()) {
    if (offset != r.next) r.error = fmt::format("piece at {}, expected {}", offset, r.next);
    if (n == 0 || n % r.grain != 0) r.error = fmt::format("a piece of {} bytes", n);
    if (reinterpret_cast<uintptr_t>(data) % r.grain != 0) r.error = "a misaligned piece";
    if (offset + n > r.bytes.size()) r.error = fmt::format("piece past the end: {}", offset + n);
  }
  if (!r.error.empty()) return;
  std::memcpy(r.bytes.data() + offset, data, n);
  r.next = offset + n;
  ++r.pieces;
}

std::vector<uint8_t> pattern(size_t n, int salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 31 + i / 251 + salt) & 0xff);
  return v;
}

struct Case {
  TransportKind transport;
  size_t ringBytes;  // shared memory only
};

class RecvApply : public ::testing::TestWithParam<Case> {};

// Rank 0 sends a `lead`-byte frame and then `bytes` of payload; rank 1 receives the first as
// usual and hands the payload to the handler. Returns rank 1's result.
Received exchange(const Case& c, size_t lead, size_t bytes, size_t grain, int rounds = 1) {
  auto o = testOptions(c.transport, 60);
  o.shmRingBytes = c.ringBytes;
  Received got;
  got.grain = grain;
  const auto payload = pattern(bytes, 7);
  const auto first = pattern(lead, 3);
  auto errors = runThreadRanks(2, o, [&](comm::Group& g) {
    transport::FrameHeader base;
    base.dtype = static_cast<uint8_t>(DataType::kUInt8);
    for (int round = 0; round < rounds; ++round) {
      comm::execute(g, comm::op::kSendRecv, base, {}, [&](comm::OpContext& ctx) {
        std::vector<transport::Transfer> b;
        std::vector<uint8_t> leadIn(lead);
        if (ctx.rank() == 0) {
          if (lead > 0) b.push_back(ctx.send(1, 0, first.data(), lead));
          b.push_back(ctx.send(1, 1, payload.data(), bytes));
        } else {
          got.bytes.assign(bytes, 0);
          got.next = 0;
          got.pieces = 0;
          if (lead > 0) b.push_back(ctx.recv(0, 0, leadIn.data(), lead));
          b.push_back(ctx.recvApply(0, 1, bytes, PieceHandler{&collect, &got, grain}));
        }
        ctx.run(b);
        if (ctx.rank() == 1) {
          EXPECT_EQ(leadIn, first);
        }
      });
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  return got;
}

TEST_P(RecvApply, LargePayloadArrivesWholeInOrderInManyPieces) {
  const size_t bytes = (3u << 20) + 4096 + 12;  // whole floats; not a multiple of any slice
  Received r = exchange(GetParam(), 0, bytes, 4, 2);
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.next, bytes);
  EXPECT_TRUE(r.bytes == pattern(bytes, 7));
  // A ring of 64 KiB (or TCP's staging of 256 KiB) cannot hold 3 MiB: many pieces.
  EXPECT_GE(r.pieces, 4u);
}

// Payloads after lead frames of 4 and 12 bytes. A ring's record puts a payload 56 bytes past a
// 64-byte line (after its stamp and the frame header), so 16-byte grains go through the
// staging, carrying a partial grain from one read to the next (TCP always stages).
TEST_P(RecvApply, MisalignedStartIsStagedAndEveryPieceIsWholeGrains) {
  for (size_t grain : {size_t{8}, size_t{16}}) {
    for (size_t lead : {size_t{4}, size_t{12}}) {
      const size_t bytes = (1u << 20) + 5 * grain;
      Received r = exchange(GetParam(), lead, bytes, grain);
      EXPECT_EQ(r.error, "") << "grain " << grain << ", lead " << lead;
      EXPECT_EQ(r.next, bytes);
      EXPECT_TRUE(r.bytes == pattern(bytes, 7)) << "grain " << grain << ", lead " << lead;
    }
  }
}

TEST_P(RecvApply, EmptyPayloadCallsNothingAndOddSizesAreRefused) {
  Received r = exchange(GetParam(), 4, 0, 4);
  EXPECT_EQ(r.pieces, 0u);
  // A payload that is not whole grains is the caller's mistake, refused before anything moves.
  auto o = testOptions(GetParam().transport, 10);
  Received bad;
  auto errors = runThreadRanks(2, o, [&](comm::Group& g) {
    if (g.rank() == 0) return;
    transport::FrameHeader base;
    comm::execute(g, comm::op::kSendRecv, base, {}, [&](comm::OpContext& ctx) {
      std::vector<transport::Transfer> b{ctx.recvApply(0, 0, 10, PieceHandler{&collect, &bad, 4})};
      ctx.run(b);
    });
  });
  EXPECT_NE(errors[1].find("a receive-apply of 10 bytes in grains of 4"), std::string::npos)
      << errors[1];
}

// A reply streamed out as the request is consumed (sendAsReady gated by the handler), the way a
// parameter server answers a push-pull. The requester sends everything before it reads the
// reply, and neither ring can hold the whole payload: the responder must keep consuming while
// its own send waits for room, or both would wait forever.
struct Echo {
  std::vector<uint32_t> out;
  size_t ready = 0;
};

void echoPlusOne(void* context, const void* data, size_t offset, size_t n) {
  auto& e = *static_cast<Echo*>(context);
  const auto* in = static_cast<const uint32_t*>(data);
  for (size_t i = 0; i < n / 4; ++i) e.out[offset / 4 + i] = in[i] + 1;
  e.ready = offset + n;
}

TEST_P(RecvApply, AReplyStreamsOutAsTheRequestIsConsumed) {
  auto o = testOptions(GetParam().transport, 60);
  o.shmRingBytes = GetParam().ringBytes;
  const size_t count = (3u << 20) / 4 + 1001;
  std::vector<uint32_t> request(count), reply(count);
  std::iota(request.begin(), request.end(), 17u);
  Echo echo;
  auto errors = runThreadRanks(2, o, [&](comm::Group& g) {
    transport::FrameHeader base;
    base.dtype = static_cast<uint8_t>(DataType::kUInt8);
    for (int round = 0; round < 2; ++round) {
      comm::execute(g, comm::op::kSendRecv, base, {}, [&](comm::OpContext& ctx) {
        const size_t bytes = count * 4;
        if (ctx.rank() == 0) {
          std::vector<transport::Transfer> b{ctx.send(1, 0, request.data(), bytes)};
          ctx.run(b);
          b.assign(1, ctx.recv(1, 1, reply.data(), bytes));
          ctx.run(b);
        } else {
          echo.out.assign(count, 0);
          echo.ready = 0;
          std::vector<transport::Transfer> b{
              ctx.recvApply(0, 0, bytes, PieceHandler{&echoPlusOne, &echo, 4}),
              ctx.sendAsReady(0, 1, echo.out.data(), bytes, &echo.ready)};
          ctx.run(b);
        }
      });
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  for (size_t i = 0; i < count; ++i) {
    if (reply[i] != request[i] + 1) {
      ADD_FAILURE() << "element " << i << ": " << reply[i] << ", expected " << request[i] + 1;
      break;
    }
  }
}

// A gate that never opens is a send that never completes: the deadline, not a hang.
TEST_P(RecvApply, AGateThatNeverOpensTimesOut) {
  auto o = testOptions(GetParam().transport, 1);
  const size_t never = 0;
  std::vector<uint8_t> data(64, 1), in(64);
  auto errors = runThreadRanks(2, o, [&](comm::Group& g) {
    transport::FrameHeader base;
    comm::execute(g, comm::op::kSendRecv, base, {}, [&](comm::OpContext& ctx) {
      std::vector<transport::Transfer> b{ctx.rank() == 0
                                             ? ctx.sendAsReady(1, 0, data.data(), 64, &never)
                                             : ctx.recv(0, 0, in.data(), 64)};
      ctx.run(b);
    });
  });
  EXPECT_NE(errors[0].find("timed out"), std::string::npos) << errors[0];
}

INSTANTIATE_TEST_SUITE_P(, RecvApply,
                         ::testing::Values(Case{TransportKind::kTcp, 4u << 20},
                                           Case{TransportKind::kShm, 64u << 10},
                                           Case{TransportKind::kShm, 4096}),
                         [](const auto& info) {
                           return info.param.transport == TransportKind::kTcp
                                      ? std::string("tcp")
                                      : fmt::format("shm_ring{}", info.param.ringBytes);
                         });

}  // namespace
}  // namespace shoal::test

// Receive-apply (transport::Transfer::recvApply) over both transports, ranks as threads: the
// handler must see the whole payload exactly once, in order, in whole aligned grains, also when
// the payload arrives in many pieces (a shared-memory ring much smaller than the payload; TCP's
// staging) and when it starts at an offset that is not aligned to the grain (the staged path).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

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
      g.execute(transport::OpCode::kSendRecv, base, {}, [&](comm::OpContext& ctx) {
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

// A 4-byte lead frame puts the payload at a 4-byte boundary of the ring: 8- and 16-byte grains
// then go through the staging, carrying a partial grain from one read to the next.
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
    g.execute(transport::OpCode::kSendRecv, base, {}, [&](comm::OpContext& ctx) {
      std::vector<transport::Transfer> b{ctx.recvApply(0, 0, 10, PieceHandler{&collect, &bad, 4})};
      ctx.run(b);
    });
  });
  EXPECT_NE(errors[1].find("a receive-apply of 10 bytes in grains of 4"), std::string::npos)
      << errors[1];
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

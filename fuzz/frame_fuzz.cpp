// Frame headers as a receiver sees them (transport/frame.h; described as comm/op_code.h names
// them): 48 header bytes from the peer, then, for an abort frame, its text. Every header is
// described (error messages print arbitrary peer headers), data frames are checked against the
// frame this rank expects, abort frames are turned into the error they carry.
//
// Oracle: checkFrame either throws a typed error or returns only for a header that matches the
// expected one in every field it compares; throwAbort always throws a typed error carrying the
// peer's text.
#include <cstring>

#include "comm/op_code.h"
#include "fuzz/frame_seed.h"
#include "fuzz/fuzz_util.h"
#include "transport/frame.h"

using namespace shoal;
using namespace shoal::transport;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr const char* kTarget = "frame";
  if (size < sizeof(FrameHeader)) return 0;
  FrameHeader got;
  std::memcpy(&got, data, sizeof(got));
  const std::string_view rest(reinterpret_cast<const char*>(data) + sizeof(got),
                              size - sizeof(got));
  const LinkContext ctx{1, 3};
  const FrameHeader e = fuzz::expectedFrame();

  fuzz::expectTypedErrors(kTarget, [&] {
    (void)describeFrame(got);
    (void)comm::describeOp(got);
  });

  if (got.kind == static_cast<uint8_t>(FrameKind::kAbort)) {
    // The endpoint reads at most kMaxAbortText bytes of text (a longer claim is refused before
    // anything is read), so the text handed on is bounded whatever the header says.
    if (got.bytes > kMaxAbortText) return 0;
    const std::string text(rest.substr(0, std::min<size_t>(rest.size(), got.bytes)));
    try {
      throwAbort(got, text, ctx);
    } catch (const Error& err) {
      // what() is a C string: the text up to its first NUL is what a reader sees.
      const std::string shown = text.substr(0, text.find('\0'));
      SHOAL_FUZZ_CHECK(kTarget, std::string_view(err.what()).find(shown) != std::string_view::npos);
      return 0;
    } catch (...) {
      fuzz::finding(kTarget, "throwAbort threw something that is not a shoal::Error");
    }
    fuzz::finding(kTarget, "throwAbort returned");
  }

  const bool accepted = fuzz::expectTypedErrors(kTarget, [&] { checkFrame(e, got, ctx); });
  if (accepted) {
    SHOAL_FUZZ_CHECK(kTarget, got.magic == e.magic && got.version == e.version &&
                                  got.kind == e.kind && got.group == e.group && got.op == e.op &&
                                  got.seq == e.seq && got.count == e.count &&
                                  got.dtype == e.dtype && got.redop == e.redop &&
                                  got.root == e.root && got.algo == e.algo && got.step == e.step &&
                                  got.bytes == e.bytes);
  }
  return 0;
}

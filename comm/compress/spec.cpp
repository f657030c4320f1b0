#include "comm/compress/spec.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>

#include "common/env.h"
#include "common/error.h"

namespace shoal::compress {

namespace {

constexpr std::string_view kAccepted =
    "expected none, fp16, bf16, topk[:DENSITY], powersgd[:RANK] or onebit, optionally followed "
    "by ,momentum=M and ,dense=ELEMENTS (topk, onebit) and ,warmup=STEPS";

[[noreturn]] void refuse(std::string_view text, std::string_view why) {
  SHOAL_THROW(InvalidArgument, "compression '{}': {}; {}", text, why, kAccepted);
}

// The message of parseInteger's / parseNumber's InvalidArgument, as the reason of ours.
template <typename Parse>
auto parsePart(std::string_view text, Parse&& parse) {
  try {
    return parse();
  } catch (const InvalidArgument& e) {
    refuse(text, e.what());
  }
}

}  // namespace

CompressionSpec CompressionSpec::parse(std::string_view text) {
  const size_t comma = text.find(',');
  const std::string_view head = text.substr(0, comma);
  const size_t colon = head.find(':');
  const std::string_view name = head.substr(0, colon);
  const bool hasParam = colon != std::string_view::npos;
  const std::string_view param = hasParam ? head.substr(colon + 1) : std::string_view();

  CompressionSpec spec;
  if (name == "none") {
    spec.codec = Codec::kNone;
  } else if (name == "fp16") {
    spec.codec = Codec::kFp16;
  } else if (name == "bf16") {
    spec.codec = Codec::kBf16;
  } else if (name == "onebit") {
    spec.codec = Codec::kOneBit;
  } else if (name == "topk") {
    spec.codec = Codec::kTopK;
    if (hasParam) {
      // parseNumber's range is closed, and a density of 0 would send nothing: one message for
      // every refusal, with the open bound.
      double d = 0;
      try {
        d = parseNumber("topk density", param, 0, 1);
      } catch (const InvalidArgument&) {
      }
      if (!(d > 0)) {
        refuse(text, fmt::format("topk density='{}': expected a number in (0, 1]", param));
      }
      spec.density = d;
    }
  } else if (name == "powersgd") {
    spec.codec = Codec::kPowerSgd;
    if (hasParam) {
      spec.rank = static_cast<int>(
          parsePart(text, [&] { return parseInteger("powersgd rank", param, 1, 1024); }));
    }
  } else {
    refuse(text, fmt::format("unknown codec '{}'", name));
  }
  if (hasParam && spec.codec != Codec::kTopK && spec.codec != Codec::kPowerSgd) {
    refuse(text, fmt::format("{} takes no parameter (':{}')", name, param));
  }

  if (comma == std::string_view::npos) return spec;
  bool warmupSeen = false, momentumSeen = false, denseSeen = false;
  // Options that need an encoding of one parameter at a time: the gather codecs'.
  const bool gather = spec.codec == Codec::kTopK || spec.codec == Codec::kOneBit;
  for (std::string_view rest = text.substr(comma + 1);;) {
    const size_t next = rest.find(',');
    const std::string_view option = rest.substr(0, next);
    const size_t eq = option.find('=');
    const std::string_view key = option.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : option.substr(eq + 1);
    if (key == "warmup") {
      if (warmupSeen) refuse(text, "warmup given twice");
      warmupSeen = true;
      spec.warmupSteps = parsePart(text, [&] {
        return parseInteger("warmup", value, 0, std::numeric_limits<int64_t>::max());
      });
    } else if (key == "momentum") {
      if (momentumSeen) refuse(text, "momentum given twice");
      momentumSeen = true;
      // Momentum correction needs an error-feedback residual to accumulate velocities in: the
      // casts keep none, and PowerSGD's residual is of its low-rank approximation.
      if (!gather) {
        refuse(text, fmt::format("momentum is top-k's and 1-bit's (momentum correction), not {}'s",
                                 name));
      }
      double m = 1;
      try {
        m = parseNumber("momentum", value, 0, 1);
      } catch (const InvalidArgument&) {
      }
      // parseNumber's range is closed; a factor of 1 would never forget a gradient.
      if (!(m < 1)) refuse(text, fmt::format("momentum='{}': expected a number in [0, 1)", value));
      spec.momentum = m;
    } else if (key == "dense") {
      if (denseSeen) refuse(text, "dense given twice");
      denseSeen = true;
      // The casts send everything whole already; PowerSGD sends small tensors whole by its own
      // rule (rank < min(n, m) and fewer elements).
      if (!gather) refuse(text, fmt::format("dense is top-k's and 1-bit's, not {}'s", name));
      spec.denseElements = parsePart(text, [&] {
        return parseInteger("dense", value, 0, std::numeric_limits<int64_t>::max());
      });
    } else {
      refuse(text, fmt::format("unknown option '{}'", option));
    }
    if (next == std::string_view::npos) return spec;
    rest.remove_prefix(next + 1);
  }
}

std::string CompressionSpec::toString() const {
  std::string s(compress::toString(codec));
  // fmt's "{}" of a double is the shortest text that reads back as the same double.
  if (codec == Codec::kTopK) s += fmt::format(":{}", density);
  if (codec == Codec::kPowerSgd) s += fmt::format(":{}", rank);
  if (momentum != 0) s += fmt::format(",momentum={}", momentum);
  if (denseElements != 0) s += fmt::format(",dense={}", denseElements);
  if (warmupSteps != 0) s += fmt::format(",warmup={}", warmupSteps);
  return s;
}

std::string_view toString(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kFp16:
      return "fp16";
    case Codec::kBf16:
      return "bf16";
    case Codec::kTopK:
      return "topk";
    case Codec::kPowerSgd:
      return "powersgd";
    case Codec::kOneBit:
      return "onebit";
  }
  return "invalid";
}

}  // namespace shoal::compress

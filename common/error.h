// The typed error family every Shoal layer throws.
//
// Messages carry the distributed context (rank, peer, operation, sequence number, time waited)
// so that a failure read in one rank's log explains itself without the others.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace shoal {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}

  // For failures of a group operation: the rank of that group where the failure started (the
  // rank that died, stopped answering, or failed locally first), or -1 when not known. Every
  // rank that fails because of the same root cause reports the same origin (see
  // Note [Root cause] in comm/native/native_engine.cpp).
  int origin() const { return origin_; }
  void setOrigin(int rank) { origin_ = rank; }

 private:
  int origin_ = -1;
};

// A blocking call ran out of its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer died, closed its connection, or aborted the operation.
class PeerError : public Error {
 public:
  using Error::Error;
};

// Bytes on the wire that are not a valid Shoal frame: wrong magic or version, truncated,
// oversized, or out of protocol order. Never trusted, never used to size an allocation.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// Ranks disagree on what they are doing: another collective, count, dtype, op or root.
class MismatchError : public Error {
 public:
  using Error::Error;
};

// A caller passed something invalid (bad size, bad rank, unknown name in a configuration).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// The rendezvous store could not be reached or answered with an error.
class StoreError : public Error {
 public:
  using Error::Error;
};

// An internal invariant of Shoal does not hold: a bug in Shoal, not in the caller's input.
// Distinct from InvalidArgument, which blames the caller.
class InternalError : public Error {
 public:
  using Error::Error;
};

// System call failures, with errno text.
class SystemError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throwSystemError(const std::string& what, int err);

}  // namespace shoal

#define SHOAL_THROW(Type, ...) throw ::shoal::Type(::fmt::format(__VA_ARGS__))

// Checks print both sides: "count == expected (77 vs 100): <context>".
#define SHOAL_CHECK(cond, ...)                                                       \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      throw ::shoal::InvalidArgument(                                                \
          ::fmt::format("check failed: {}: {}", #cond, ::fmt::format(__VA_ARGS__))); \
    }                                                                                \
  } while (0)

// For invariants that only a bug in Shoal can break (SHOAL_CHECK blames the caller).
#define SHOAL_ASSERT(cond, ...)                                                                   \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      throw ::shoal::InternalError(::fmt::format("internal error: {} does not hold at {}:{}: {}", \
                                                 #cond, __FILE__, __LINE__,                       \
                                                 ::fmt::format(__VA_ARGS__)));                    \
    }                                                                                             \
  } while (0)

#define SHOAL_CHECK_OP(a, b, op, ...)                                                           \
  do {                                                                                          \
    const auto& shoal_a_ = (a);                                                                 \
    const auto& shoal_b_ = (b);                                                                 \
    if (!(shoal_a_ op shoal_b_)) {                                                              \
      throw ::shoal::InvalidArgument(::fmt::format("check failed: {} {} {} ({} vs {}): {}", #a, \
                                                   #op, #b, shoal_a_, shoal_b_,                 \
                                                   ::fmt::format(__VA_ARGS__)));                \
    }                                                                                           \
  } while (0)

#define SHOAL_CHECK_EQ(a, b, ...) SHOAL_CHECK_OP(a, b, ==, __VA_ARGS__)
#define SHOAL_CHECK_LT(a, b, ...) SHOAL_CHECK_OP(a, b, <, __VA_ARGS__)
#define SHOAL_CHECK_LE(a, b, ...) SHOAL_CHECK_OP(a, b, <=, __VA_ARGS__)
#define SHOAL_CHECK_GE(a, b, ...) SHOAL_CHECK_OP(a, b, >=, __VA_ARGS__)

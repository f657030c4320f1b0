// What every fuzz target shares: scratch files and the oracle for exceptions.
//
// A decoder's contract is that bad bytes end in one of the typed errors of common/error.h (a
// one-line message for the user). Anything else escaping it (std::out_of_range from a
// substring, std::bad_alloc from a length nobody checked, an exception type of a library) is a
// finding: expectTypedErrors prints it and aborts, so libFuzzer keeps the input as a crash.
// Memory errors and undefined behaviour are found by the sanitizers the targets are built with.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

#include "common/error.h"

namespace shoal::fuzz {

// A private folder for this process's scratch files (libFuzzer may run several jobs at once),
// removed when the process exits normally.
inline const std::string& scratchDir() {
  struct Dir {
    std::string path;
    Dir() {
      std::string tmpl = (std::filesystem::temp_directory_path() / "shoal-fuzz-XXXXXX").string();
      if (!::mkdtemp(tmpl.data())) {
        std::perror("mkdtemp");
        std::abort();
      }
      path = tmpl;
    }
    ~Dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static Dir dir;
  return dir.path;
}

inline void writeFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write scratch file %s\n", path.c_str());
    std::abort();
  }
}

[[noreturn]] inline void finding(const char* target, const char* what) {
  std::fprintf(stderr, "fuzz %s: %s\n", target, what);
  std::abort();
}

// Runs fn; shoal::Error (and, where the decoder documents it, Extra) is the decoder's answer to
// bad bytes. Returns true when fn returned normally.
template <typename Extra = void, typename F>
bool expectTypedErrors(const char* target, F&& fn) {
  try {
    fn();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    if constexpr (!std::is_void_v<Extra>) {
      if (dynamic_cast<const Extra*>(&e)) return false;
    }
    // The type's (mangled) name too: some libraries' exceptions have an empty what().
    std::string msg =
        std::string("untyped exception escaped the decoder: ") + typeid(e).name() + ": " + e.what();
    finding(target, msg.c_str());
  }
}

#define SHOAL_FUZZ_CHECK(target, cond)                                   \
  do {                                                                   \
    if (!(cond)) ::shoal::fuzz::finding(target, "check failed: " #cond); \
  } while (0)

}  // namespace shoal::fuzz

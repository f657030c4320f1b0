# Sourced by build.sh, sanitize.sh and fuzz.sh. Sets LAUNCHER to the CMake arguments that compile
# through ccache when it is installed (setup.sh installs it), empty otherwise.
#
# The settings travel in the launcher itself, so a plain `ninja -C build` uses them too:
#   CCACHE_BASEDIR=<checkout>  paths inside the checkout enter the cache key relative to the build
#                              directory, so a fresh clone somewhere else (as CI makes) reuses what
#                              an earlier build of the same sources stored;
#   CCACHE_NOHASHDIR           the same for builds with debug info (the asan and fuzz builds);
#   CCACHE_SLOPPINESS          what ccache needs for precompiled headers. cmake/torch_pch.cmake
#                              leaves its header out under a launcher (hashing the 600 MB file
#                              cost more than it saved), so today this only relaxes ccache's
#                              file-time checks; kept so the cache stays keyed as it was filled.
# A cache miss costs nothing but the compile; SHOAL_NO_CCACHE=1 leaves ccache out.
LAUNCHER=()
if [ -z "${SHOAL_NO_CCACHE:-}" ] && command -v ccache >/dev/null; then
  LAUNCHER=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$PWD;CCACHE_NOHASHDIR=1;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;ccache")
else
  LAUNCHER=(-UCMAKE_CXX_COMPILER_LAUNCHER)
fi

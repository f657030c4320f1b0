# One precompiled <torch/torch.h>, built with shoal_train and reused by every target that compiles
# against libtorch (examples, tools, tests, benchmarks, fuzz targets).
#
# Why: parsing libtorch's headers is about a third of each such file's compile time
# (train/optim/lars.cpp: 28 s without, 19 s with, alone on a 2-core machine), and about 115 of
# the build's files include them. REUSE_FROM builds the header once instead of once per target
# (a 600 MB .gch takes ~50 s). GCC checks that the flags match (CMake adds -Winvalid-pch) and
# falls back to parsing the header where they do not, so a mismatch costs time, never
# correctness.
#
# Not with a compiler launcher (scripts/compiler_cache.sh puts ccache there): ccache hashes the
# 600 MB .gch on every lookup, which costs 3.5 s on a miss and makes a hit 3 s instead of 0.1 s,
# and a whole build with both was no faster than one without the header (36 min either way).
# Off with -DSHOAL_TORCH_PCH=OFF (e.g. to check that every file includes what it uses). Only GCC
# builds use it: the clang builds (fuzz/, scripts/fuzz.sh) were not measured with it.

option(SHOAL_TORCH_PCH "Precompile <torch/torch.h> once for every libtorch target" ON)

# Sets ${out} to TRUE when ${target} links libtorch, directly or through Shoal's own libraries.
function(shoal_links_torch target out)
  set(found FALSE)
  get_target_property(libs ${target} LINK_LIBRARIES)
  if(libs)
    foreach(lib IN LISTS libs)
      if(lib STREQUAL "shoal_train" OR lib STREQUAL "torch")
        set(found TRUE)
      elseif(TARGET ${lib} AND lib MATCHES "^shoal_")
        shoal_links_torch(${lib} sub)
        if(sub)
          set(found TRUE)
        endif()
      endif()
      if(found)
        break()
      endif()
    endforeach()
  endif()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# Call once with every directory (already added) whose targets may compile against libtorch.
function(shoal_reuse_torch_pch)
  if(NOT SHOAL_TORCH_PCH OR NOT TARGET shoal_train OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU"
     OR CMAKE_CXX_COMPILER_LAUNCHER)
    return()
  endif()
  target_precompile_headers(shoal_train PRIVATE <torch/torch.h>)
  foreach(dir IN LISTS ARGN)
    get_property(added DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(t IN LISTS added)
      get_target_property(type ${t} TYPE)
      if(t STREQUAL "shoal_train" OR NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY)$")
        continue()
      endif()
      shoal_links_torch(${t} uses_torch)
      if(uses_torch)
        target_precompile_headers(${t} REUSE_FROM shoal_train)
        list(APPEND reused ${t})
      endif()
    endforeach()
  endforeach()
  list(LENGTH reused n)
  message(STATUS "Shoal: <torch/torch.h> precompiled once, reused by ${n} targets")
endfunction()

# What `cmake --install` puts under the prefix, so an outside project can build against Shoal:
#
#   include/shoal/<layer>/*.h            #include <shoal/run/init.h>
#   lib/libshoal_*.a                     the layers (static)
#   lib/cmake/Shoal/                     find_package(Shoal [COMPONENTS mpi train])
#   lib/pkgconfig/shoal.pc, shoal-mpi.pc pkg-config --cflags --libs shoal
#   bin/shoal, bin/shoal_demo, ...       the launcher and the tools
#
# Targets: Shoal::shoal (the engine, launcher, parameter servers and tracking: everything but
# MPI and libtorch), Shoal::mpi (shoal::initWithMpi() and the OpenMPI backend) and Shoal::train
# (the libtorch layer). Each carries its own dependencies, so a program names one target and
# nothing else; the MPI and libtorch ones are separate export sets, read only when their
# component is asked for, so a program that uses neither needs neither installed.

# The umbrella target: what a program that only needs collectives, the launcher, parameter
# servers or tracking links (Shoal::shoal outside, shoal_core here).
add_library(shoal_core INTERFACE)
target_link_libraries(shoal_core INTERFACE shoal_run shoal_ps shoal_track)
set_target_properties(shoal_core PROPERTIES EXPORT_NAME shoal)
add_library(Shoal::shoal ALIAS shoal_core)

set(SHOAL_CORE_LIBS shoal_common shoal_compress shoal_store shoal_transport shoal_comm shoal_run
  shoal_ps shoal_track shoal_pipeline_schedule shoal_partition)
foreach(lib IN LISTS SHOAL_CORE_LIBS)
  string(REPLACE "shoal_" "" name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${name})
endforeach()

set(SHOAL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Shoal)
install(TARGETS shoal_core ${SHOAL_CORE_LIBS} EXPORT ShoalTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT ShoalTargets NAMESPACE Shoal:: DESTINATION ${SHOAL_CMAKE_DIR})
install(TARGETS shoal shoal_demo RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Every layer's public headers; run/init_backend.h is private to run/.
set(SHOAL_HEADER_DIRS common store transport comm run track ps)
if(SHOAL_WITH_TORCH)
  list(APPEND SHOAL_HEADER_DIRS train)
endif()
foreach(dir IN LISTS SHOAL_HEADER_DIRS)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir} DESTINATION ${SHOAL_INSTALL_INCLUDE}
    FILES_MATCHING PATTERN "*.h" PATTERN "init_backend.h" EXCLUDE)
endforeach()

if(SHOAL_WITH_MPI)
  install(TARGETS shoal_mpi shoal_run_mpi EXPORT ShoalMpiTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT ShoalMpiTargets NAMESPACE Shoal:: DESTINATION ${SHOAL_CMAKE_DIR})
  set_target_properties(shoal_mpi PROPERTIES EXPORT_NAME mpi_engine)
  add_library(Shoal::mpi ALIAS shoal_run_mpi)
endif()
if(SHOAL_WITH_TORCH)
  install(TARGETS shoal_train EXPORT ShoalTrainTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT ShoalTrainTargets NAMESPACE Shoal:: DESTINATION ${SHOAL_CMAKE_DIR})
  install(TARGETS shoal_consolidate shoal_export shoal_serve fashion_mnist trainer_mnist
    pipeline_mnist gpt_fortunes
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  add_library(Shoal::train ALIAS shoal_train)
endif()

include(CMakePackageConfigHelpers)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ShoalConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/ShoalConfig.cmake INSTALL_DESTINATION ${SHOAL_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ShoalConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ShoalConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/ShoalConfigVersion.cmake DESTINATION ${SHOAL_CMAKE_DIR})

# pkg-config, for builds without CMake. The libraries are static, so their own dependencies are
# in Libs (not Libs.private), in link order.
configure_file(${CMAKE_CURRENT_LIST_DIR}/shoal.pc.in ${CMAKE_CURRENT_BINARY_DIR}/shoal.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/shoal.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(SHOAL_WITH_MPI)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/shoal-mpi.pc.in ${CMAKE_CURRENT_BINARY_DIR}/shoal-mpi.pc
    @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/shoal-mpi.pc
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()

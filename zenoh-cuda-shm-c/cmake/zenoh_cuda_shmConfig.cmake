# The CMake package of zenoh-cuda-shm's C ABI, as laid out by scripts/c-install.sh:
#   <prefix>/include/zenoh_cuda_shm.h (C) and zenoh_cuda_shm.hpp (C++)
#   <prefix>/lib/libzenoh_cuda_shm_c.so and libzenoh_cuda_shm_c.a
#   <prefix>/lib/cmake/zenoh_cuda_shm/zenoh_cuda_shmConfig.cmake (this file)
#
#   find_package(zenoh_cuda_shm REQUIRED)
#   target_link_libraries(app PRIVATE zenoh_cuda_shm::zenoh_cuda_shm)         # shared
#   target_link_libraries(app PRIVATE zenoh_cuda_shm::zenoh_cuda_shm_static)  # static
#
# The library opens libcuda at run time: nothing CUDA is needed to link against it.
get_filename_component(_zcs_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(zenoh_cuda_shm_INCLUDE_DIR "${_zcs_prefix}/include")

if(NOT TARGET zenoh_cuda_shm::zenoh_cuda_shm)
  add_library(zenoh_cuda_shm::zenoh_cuda_shm SHARED IMPORTED)
  set_target_properties(zenoh_cuda_shm::zenoh_cuda_shm PROPERTIES
    IMPORTED_LOCATION "${_zcs_prefix}/lib/libzenoh_cuda_shm_c.so"
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "${zenoh_cuda_shm_INCLUDE_DIR}")
endif()

if(NOT TARGET zenoh_cuda_shm::zenoh_cuda_shm_static AND EXISTS "${_zcs_prefix}/lib/libzenoh_cuda_shm_c.a")
  add_library(zenoh_cuda_shm::zenoh_cuda_shm_static STATIC IMPORTED)
  set_target_properties(zenoh_cuda_shm::zenoh_cuda_shm_static PROPERTIES
    IMPORTED_LOCATION "${_zcs_prefix}/lib/libzenoh_cuda_shm_c.a"
    INTERFACE_INCLUDE_DIRECTORIES "${zenoh_cuda_shm_INCLUDE_DIR}"
    # What a Rust static library needs from the system.
    INTERFACE_LINK_LIBRARIES "pthread;dl;m;rt")
endif()

set(zenoh_cuda_shm_FOUND TRUE)

# Locates the CUDA libraries we link, under the toolkit that nvcc belongs to, after
# enable_language(CUDA). We do not use find_package(CUDAToolkit): Debian bookworm's CMake 3.25
# module fails at configure time against CUDA 13 (it marks CUDA::nvToolsExt deprecated, a target
# CUDA 13 no longer ships, and errors out when cmake_minimum_required is 3.25), and a user's
# stock CMake must be enough.
#
# Defines WF_CUDA_ROOT, WF_CUDA_INCLUDE_DIRS and, for each library found, an imported target
# wf::cuda_<name> (cudart_static always, required; cudart, cublas, nccl when present).

get_filename_component(_wf_nvcc_dir "${CMAKE_CUDA_COMPILER}" REALPATH)
get_filename_component(_wf_nvcc_dir "${_wf_nvcc_dir}" DIRECTORY)
get_filename_component(WF_CUDA_ROOT "${_wf_nvcc_dir}" DIRECTORY)

# nvcc reports where its own headers and libraries live; the toolkit's usual layouts follow.
set(WF_CUDA_INCLUDE_DIRS ${CMAKE_CUDA_TOOLKIT_INCLUDE_DIRECTORIES})
if(NOT WF_CUDA_INCLUDE_DIRS)
  set(WF_CUDA_INCLUDE_DIRS "${WF_CUDA_ROOT}/include")
endif()
set(_wf_cuda_lib_hints ${CMAKE_CUDA_IMPLICIT_LINK_DIRECTORIES} "${WF_CUDA_ROOT}/lib64"
    "${WF_CUDA_ROOT}/lib" "${WF_CUDA_ROOT}/targets/${CMAKE_SYSTEM_PROCESSOR}-linux/lib")

# wf_cuda_find_library(<name> [REQUIRED] [DEPS lib...]): imported target wf::cuda_<name>.
function(wf_cuda_find_library name)
  cmake_parse_arguments(L "REQUIRED" "" "DEPS" ${ARGN})
  find_library(WF_CUDA_${name}_LIBRARY NAMES ${name} HINTS ${_wf_cuda_lib_hints} NO_DEFAULT_PATH)
  if(NOT WF_CUDA_${name}_LIBRARY)
    # Libraries outside the toolkit tree (nccl from Debian or NVIDIA's repositories).
    find_library(WF_CUDA_${name}_LIBRARY NAMES ${name})
  endif()
  if(NOT WF_CUDA_${name}_LIBRARY)
    if(L_REQUIRED)
      message(FATAL_ERROR "weightfloor: CUDA library ${name} not found under ${WF_CUDA_ROOT}")
    endif()
    return()
  endif()
  add_library(wf::cuda_${name} UNKNOWN IMPORTED GLOBAL)
  set_target_properties(wf::cuda_${name} PROPERTIES IMPORTED_LOCATION "${WF_CUDA_${name}_LIBRARY}")
  target_include_directories(wf::cuda_${name} SYSTEM INTERFACE ${WF_CUDA_INCLUDE_DIRS})
  if(L_DEPS)
    target_link_libraries(wf::cuda_${name} INTERFACE ${L_DEPS})
  endif()
endfunction()

# The static runtime needs the thread, dynamic-loading and real-time libraries of libc.
wf_cuda_find_library(cudart_static REQUIRED DEPS Threads::Threads ${CMAKE_DL_LIBS} rt)
wf_cuda_find_library(cudart)
wf_cuda_find_library(cublas)
wf_cuda_find_library(nccl)

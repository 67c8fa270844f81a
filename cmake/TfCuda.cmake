# The CUDA toolkit is a build dependency for its headers (cuda.h) only: nothing links
# against it. It is found through CUDAToolkit_ROOT, CUDA_PATH, nvcc on PATH or the usual
# install prefix, never assumed at a fixed path.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  set(TF_CUDA_INCLUDE_DIR ${CUDAToolkit_INCLUDE_DIRS})
else()
  find_path(TF_CUDA_INCLUDE_DIR cuda.h
            HINTS ENV CUDA_PATH ENV CUDA_HOME PATH_SUFFIXES include targets/x86_64-linux/include)
endif()
find_file(TF_CUDA_H cuda.h PATHS ${TF_CUDA_INCLUDE_DIR} NO_DEFAULT_PATH)
if(NOT TF_CUDA_H)
  message(FATAL_ERROR "cuda.h not found: install the CUDA toolkit headers or set CUDAToolkit_ROOT")
endif()
message(STATUS "cuda.h: ${TF_CUDA_H}")
add_library(tf_cuda_headers INTERFACE)
target_include_directories(tf_cuda_headers SYSTEM INTERFACE ${TF_CUDA_INCLUDE_DIR})

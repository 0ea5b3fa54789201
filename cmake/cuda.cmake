# Decides whether CUDA kernels are built, and how. Sets AV_WITH_CUDA, AV_CPU_ONLY_REASON and
# av_configure_cuda_target(). A machine without nvcc (or AV_CUDA=0) gets a CPU-only build that says so.
include(CheckLanguage)

set(AV_WITH_CUDA OFF)
set(AV_CPU_ONLY_REASON "")
if(DEFINED ENV{AV_CUDA} AND "$ENV{AV_CUDA}" STREQUAL "0")
  set(AV_CPU_ONLY_REASON "disabled by AV_CUDA=0")
else()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(AV_WITH_CUDA ON)
  else()
    set(AV_CPU_ONLY_REASON "no CUDA compiler (nvcc) found at build time")
  endif()
endif()

if(NOT AV_WITH_CUDA)
  message(WARNING "adaptive_verify: building the C++ CPU kernels only (${AV_CPU_ONLY_REASON}). "
                  "CUDA tensors will be rejected with a clear error.")
  return()
endif()

if(DEFINED ENV{AV_CUDA_ARCHS} AND NOT "$ENV{AV_CUDA_ARCHS}" STREQUAL "")
  set(AV_CUDA_ARCHS "$ENV{AV_CUDA_ARCHS}")
elseif(NOT DEFINED AV_CUDA_ARCHS)
  set(AV_CUDA_ARCHS "90a;100a;103a")
endif()
string(REPLACE "," ";" AV_CUDA_ARCHS "${AV_CUDA_ARCHS}")
# We pass -gencode ourselves so that arch-specific suffixes (90a, 100a, 103a) mean exactly what nvcc says.
set(CMAKE_CUDA_ARCHITECTURES OFF)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_RUNTIME_LIBRARY Static)  # the module needs only the driver at run time
message(STATUS "adaptive_verify: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${AV_CUDA_ARCHS}")

function(av_configure_cuda_target target)
  set(gencode "")
  foreach(arch IN LISTS AV_CUDA_ARCHS)
    list(APPEND gencode "-gencode=arch=compute_${arch},code=sm_${arch}")
  endforeach()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${gencode} -lineinfo --expt-relaxed-constexpr -Xptxas=--warn-on-spills -O3>)
  if("$ENV{AV_PTXAS_VERBOSE}" STREQUAL "1")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
  endif()
  string(REPLACE ";" "," archs_csv "${AV_CUDA_ARCHS}")
  target_compile_definitions(${target} PRIVATE AV_WITH_CUDA
    AV_CUDA_ARCHS="${archs_csv}" AV_CUDA_COMPILER_VERSION="${CMAKE_CUDA_COMPILER_VERSION}")
  target_link_libraries(${target} PRIVATE CUDA::cudart_static)
endfunction()

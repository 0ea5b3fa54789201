# Use ccache for C++ and CUDA when it is installed: rebuilds on 2 cores are otherwise slow.
find_program(AV_CCACHE ccache)
if(AV_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${AV_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${AV_CCACHE})
endif()

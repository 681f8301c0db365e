# The library's sources, included by the top-level CMakeLists.txt: the core and
# the CPU backend always; the CUDA backend (lib/cuda, kernels/) when a CUDA
# compiler was found, else lib/cuda/stub.cc in its place.
file(GLOB_RECURSE SSA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cc)
list(FILTER SSA_SOURCES EXCLUDE REGEX "/lib/cuda/[^/]*$")
# The NCCL collectives are a library of their own (CMakeLists.txt: ssa_nccl_collective).
list(FILTER SSA_SOURCES EXCLUDE REGEX "/lib/shard/nccl/")
if(SSA_HAVE_CUDA)
  file(GLOB SSA_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/cuda/*.cc
    ${CMAKE_CURRENT_LIST_DIR}/cuda/*.cu ${PROJECT_SOURCE_DIR}/kernels/*.cu)
  list(REMOVE_ITEM SSA_CUDA_SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda/stub.cc)
else()
  set(SSA_CUDA_SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda/stub.cc)
endif()
# k-means++ seeding rounds every product and sum as the GPU's seeding kernel does
# (lib/index/kmeans_pp_rule.h), and the query-aware proxies' steps per key as
# kernels/query_aware_train.cu does: no contraction into fused multiply-adds.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/index/kmeans.cc ${CMAKE_CURRENT_LIST_DIR}/index/key_weights.cc
                            ${CMAKE_CURRENT_LIST_DIR}/index/query_transform.cc ${CMAKE_CURRENT_LIST_DIR}/index/rotation.cc
                            PROPERTIES COMPILE_OPTIONS -ffp-contract=off)

// Marks functions shared by the CPU backend and the CUDA kernels. The CPU backend
// is the reference for the GPU one only if both run literally the same math.
#pragma once

#if defined(__CUDACC__)
#define SSA_HD __host__ __device__ __forceinline__
#else
#define SSA_HD inline
#endif

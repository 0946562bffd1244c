// cutlass_convt: device entry point of one emitted CUTLASS 3.x SM90 fprop kernel (ConvtKernel
// from operation.h: cutlass::conv::kernel::ConvUniversal<..., TMA + wgmma, warp-specialized>),
// under a stable, unmangled name for cuLibraryGetKernel / cuModuleGetFunction.
//
// Same body as cutlass::device_kernel<ConvtKernel> (cutlass/device_kernel.h):
//  * Params is taken by value as __grid_constant__: it holds the TMA descriptors (CUtensorMap),
//    which the TMA instructions address in the kernel parameter space, so the kernel must not copy
//    them to local memory.
//  * shared memory is dynamic only (ConvtKernel::SharedStorageSize bytes, > 48 KiB, so the
//    launcher must set CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first); the kernel lays out
//    its SharedStorage from the start of the dynamic window.
// Build: -gencode=arch=compute_90a,code=sm_90a (the 'a' features: wgmma, setmaxnreg).
#include "operation.h"

extern "C" __global__ void
__launch_bounds__(ConvtKernel::MaxThreadsPerBlock, ConvtKernel::MinBlocksPerMultiprocessor)
cutlass_convt_fprop_sm90_kernel(typename ConvtKernel::Params const __grid_constant__ params) {
  extern __shared__ char smem[];
  ConvtKernel op;
  op(params, smem);
}

// cutlass_convt: the device entry point of one emitted CUTLASS kernel (ConvtKernel from
// operation.h), under a stable, unmangled name so the launcher finds it with cuLibraryGetKernel.
#include "operation.h"

extern "C" __global__ void __launch_bounds__(ConvtKernel::kThreadCount)
cutlass_convt_dgrad_kernel(typename ConvtKernel::Params params) {
  extern __shared__ int shared_storage_base[];
  auto &shared_storage =
      *reinterpret_cast<typename ConvtKernel::SharedStorage *>(shared_storage_base);
  ConvtKernel op;
  op(params, shared_storage);
}

// cutlass_convt: device helpers shared by direct.cu and the strip family's templates: TF32
// rounding and mbarrier operations (PTX ISA: "Parallel Synchronization and Communication
// Instructions: mbarrier"), in forms valid on sm_80 and later; for sm_90a builds also wgmma's
// shared-memory descriptors.
#pragma once
#include <cstdint>
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
#include "cute/arch/mma_sm90_desc.hpp"
#endif

namespace {

// The nearest TF32 value (ties away from zero), as bits: the rounding whose results match
// cuDNN's TF32 kernels (the tensor cores alone would truncate the low mantissa bits).
__device__ __forceinline__ uint32_t tf32_nearest(float v) {
  return (__float_as_uint(v) + 0x1000u) & 0xffffe000u;
}

__device__ __forceinline__ uint32_t smem_address(void const *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void barrier_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}

// Wait until the phase of parity `parity` has completed (on a new barrier, parity 1 has).
__device__ __forceinline__ void barrier_wait(uint64_t *bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
#else
      "mbarrier.test_wait.parity.shared::cta.b64 done, [%0], %1;\n"
#endif
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

// Order this thread's shared-memory writes before later reads by the async proxy (wgmma, TMA).
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) || !defined(__CUDA_ARCH__)
// wgmma's descriptor of a matrix in shared memory from `start`: the byte offsets between core
// matrices along the leading and the stride dimension, and the layout (0: no swizzle, 1: 128-byte
// swizzle). Adding n to it moves the start by 16 n bytes.
__device__ __forceinline__ uint64_t gmma_descriptor(void const *start, uint32_t leading,
                                                    uint32_t stride, int layout) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = smem_address(start) >> 4;
  d.bitfield.leading_byte_offset_ = leading >> 4;
  d.bitfield.stride_byte_offset_ = stride >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = layout;
  return d.desc_;
}
#endif

}  // namespace

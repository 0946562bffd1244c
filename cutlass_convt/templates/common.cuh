// cutlass_convt: device helpers shared by direct.cu and strip.cu: TF32 rounding and mbarrier
// operations (PTX ISA: "Parallel Synchronization and Communication Instructions: mbarrier"), in
// forms valid on sm_80 and later.
#pragma once
#include <cstdint>

namespace {

// The nearest TF32 value (ties away from zero), as bits: the same results as cuDNN's TF32
// kernels on problem 71 (docs/perf-notes.md, v0.4).
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

}  // namespace

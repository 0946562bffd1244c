// cutlass_convt: the strip family's "rs" form (StripConfig, mma = "rs"), a stride-1
// transposed convolution on NCHW or NHWC (channels_last) tensors, C_in = C_out = 32, R = S = 3,
// TF32 or 3xTF32, for SM90 (wgmma + TMA), with x as wgmma's A operand from registers: no
// transpose pass; and at the end of this file its edge kernel (the few output columns beyond
// whole strips, on CUDA cores). docs/design/strip.md describes both.
//
//   y[n, co, p, q] = bias[co]
//                    + sum_{ci, r, s} x[n, ci, p + pad_h - r, q + pad_w - s] * w[ci, co, r, s]
//
// A CTA walks strips and runs of pairs of output rows as strip.cu's, or with kSplitAll
// over the units of all strips split evenly among the CTAs (strip_common.cuh's for_each_run):
// warpgroup 0's thread 0 loads input rows with TMA (kPix columns x 32 channels; NCHW as
// [channel][column], NHWC as [column][channel] with the 128-byte swizzle) into a ring of kRing
// rows; two consumer warpgroups, side by side, each own 64 output columns of the CTA's
// 128-column strip and walk all input rows of a run. Per input
// row, 12 steps (filter column s, 8 channels c8): each thread loads its A fragment (4 floats)
// from the landed row (a step before it is needed: kDeferRound), rounds it to TF32 (3xTF32:
// splits it into big and small TF32 parts), and
// the warpgroup issues one m64n96k8 (3xTF32: three, small products first, into the same
// accumulators) whose B is the filter block (s, c8) of all 3 filter rows x 32 output channels
// (K-major, no swizzle, in shared memory; 3xTF32: the filter's small parts after its big ones).
// Its 48 accumulators (fresh per input row, two sets by row parity) hold input row j's parts of
// output rows j - 2 (r = 0), j - 1 (r = 1) and j (r = 2): at the first step of row j + 1 they
// are folded into two running sums, and output row j - 2 is complete: bias added, it goes to a
// stage of the consumer, which the consumer's storer warp (warp 1 or 2 of warpgroup 0) writes to
// y: NCHW from [channel][column] with 8-byte stores (NCHW rows are not 16-byte aligned), NHWC
// from [column][channel] (128-byte swizzle) with a TMA store, clipped at the image's edge.
// ptxas dictates this loop's shape: accumulators cannot rotate through registers (C7511), and
// the previous row's accumulators can be read only right after a wait<0> at a row's first step
// (read anywhere else, ptxas serializes every wgmma, C7514, which build.py takes for a failed
// build).
#include <cstdint>
#include <utility>

#include "common.cuh"  // tf32_nearest, mbarrier helpers, fence_async_shared, gmma_descriptor
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "config.h"  // kS kTileN kRing kStageRows kPrepGroups kSharedBytes kNhwc kThreePass
                     // kSplitAll (from StripConfig)
#include "strip_common.cuh"  // StripParams, the walk, input-row loads

namespace {

static_assert(kTileN == 128 && kRing == 6 && kStageRows == 1 && kPrepGroups == 0 && kS == 3,
              "StripConfig's rs form: 2 x 64 columns, 6 ring rows, S = 3");
// strips kTileN apart (the edge kernel takes the columns from p.strips * kTileN on)
static_assert(kStripStep == kTileN, "StripConfig.strip_step");
constexpr int kCols = 64;  // output columns per consumer
constexpr int kConsumers = kTileN / kCols;
// NCHW: a warp's A loads (8 columns x 4 channels) hit 32 banks; NHWC: the swizzle sees to it
static_assert(kNhwc || kPix % 32 == 8 || kPix % 32 == 24, "bank conflicts");
constexpr int kBlockFloats = kR * kCO * 8;  // B block (s, c8): 96 n x 8 k
constexpr int kFilterFloats = kS * (kCI / 8) * kBlockFloats;
constexpr int kFilterCopies = kThreePass ? 2 : 1;  // 3xTF32: the big parts, then the small ones
// A stage holds an output row of a consumer: NCHW [co][column], a pitch of 68 (2 x pitch = 8
// (mod 32) words, so a warp's writes, co of 2 t4 x column g8, hit 32 banks); NHWC [column][co]
// with the 128-byte swizzle (16-byte chunk c of column j at c ^ j % 8), as the TMA store reads it.
constexpr int kStagePitch = kCols + 4;
constexpr int kStageFloats = kNhwc ? kCols * kCO : kCO * kStagePitch;
__device__ __forceinline__ int stage_index(int co, int column) {
  if constexpr (kNhwc)
    return column * kCO + ((co / 4) ^ (column % 8)) * 4 + co % 4;
  else
    return co * kStagePitch + column;
}
// The A fragments' shared-memory loads one step ahead of their rounding (so that a step's
// rounding does not wait for its loads), except for 3xTF32 on NHWC, where the deferral does not
// pay (docs/design/strip.md, Defaults).
constexpr bool kDeferRound = !(kNhwc && kThreePass);
constexpr int kStagesPer = 2;                                     // stages per consumer
constexpr int kStages = kStagesPer * kConsumers;
constexpr int kThreads = 128 * (1 + kConsumers);
// setmaxnreg: the producer warpgroup (the TMA issuer and the storer warps) gives registers to
// the consumers (168 each at launch; the counts may sum to the launch's pool). NHWC's storers
// only issue TMA stores, so its consumers take more (ptxas: 0 spills at these counts; the NHWC
// consumers spill at 208, the NCHW storers at 40).
constexpr int kProducerRegs = kNhwc ? 40 : 88, kConsumerRegs = kNhwc ? 232 : 208;
static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (1 + kConsumers) * 168, "the pool");
static_assert(4 * (kFilterCopies * kFilterFloats + kRing * kRowFloats + kStages * kStageFloats) +
                      8 * (2 * kRing + 2 * kStages) + 4 * kCO ==
                  kSharedBytes,
              "shared memory layout differs from StripConfig's");
constexpr CacheHint kLoadHint = CacheHint::EVICT_NORMAL;
static_assert(!kNhwc || (kFilterCopies * kFilterFloats * 4 % 1024 == 0 &&
                         kStageFloats * 4 % 1024 == 0),
              "NHWC: ring rows and stages start at multiples of 1024 bytes (the swizzle)");

using Op = cute::SM90::GMMA::MMA_64x96x8_F32TF32TF32_RS_TN<>;
template <std::size_t... I>
__device__ __forceinline__ void wgmma(uint32_t const (&a)[4], uint64_t db, float (&d)[48],
                                      bool accumulate, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], db, d[I]...,
          accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

// B blocks (s, c8): n = 32 r + co, k = ci - 8 c8; core matrices of 8 n x 4 k (16-byte rows),
// core (n / 8, k / 4) at byte 128 (2 (n / 8) + k / 4); rounded to TF32 (3xTF32: the big parts,
// then the small ones). Staged by kStagers threads (t of them), each with all its loads in
// flight before it stores (as strip.cu's stage_filter).
template <int kStagers>
__device__ __forceinline__ void stage_filter(float const *__restrict__ w, float *b, int t) {
  constexpr int kPer = (kFilterFloats + kStagers - 1) / kStagers;
  float v[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    int const i = t + kStagers * j;
    int const block = i / kBlockFloats, in = i % kBlockFloats;
    int const s = block / (kCI / 8), c8 = block % (kCI / 8);
    int const core = in / 32, n = core / 2 * 8 + in % 32 / 4, k = core % 2 * 4 + in % 4;
    int const r = n / kCO, co = n % kCO, ci = 8 * c8 + k;
    v[j] = i < kFilterFloats ? w[(ci * kCO + co) * (kR * kS) + r * kS + s] : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    int const i = t + kStagers * j;
    if (i < kFilterFloats) {
      uint32_t const big = tf32_nearest(v[j]);
      b[i] = __uint_as_float(big);
      if constexpr (kThreePass)
        b[kFilterFloats + i] = __uint_as_float(tf32_nearest(v[j] - __uint_as_float(big)));
    }
  }
  fence_async_shared();
}

// Thread 0: rows of a run, input rows 2 k0 + pad_h - 2 ... (2 pairs + 2 rows); the g-th row of
// the CTA goes to ring slot g % kRing.
__device__ void produce(StripParams const &p, cute::TmaDescriptor const *tmap_x, float *ring,
                        uint64_t *landed, uint64_t *empty) {
  uint32_t g = 0;
  for_each_run<kSplitAll>(p, [&](int strip, int n, int k0, int pairs) {
    int const rows = 2 * pairs + kR - 1, h0 = 2 * k0 + p.pad_h - (kR - 1);
    int const w0 = strip_q0(p, strip) + p.pad_w - (kS - 1);
#pragma unroll 1  // (unrolled, the NHWC producer spills at its 40 registers)
    for (int j = 0; j < rows; ++j, ++g)
      load_row<kRing>(tmap_x, ring + g % kRing * kRowFloats, landed, empty, g, kLoadHint,
                      kNhwc ? w0 : w0 & ~3, h0 + j, n);
  });
}

// Consumer warpgroup c: output columns q0 + 64 c ... + 63 of the CTA's strip. Accumulator
// 4 j + e of a thread: pixel 16 warp + lane / 4 + 8 (e / 2), n = 8 j + 2 (lane % 4) + e % 2
// (filter row n / 32, channel n % 32).
__device__ void consume(StripParams const &p, float const *b, float const *sbias, float *ring,
                        float *stages,
                        uint64_t *landed, uint64_t *empty, uint64_t *stage_full,
                        uint64_t *stage_empty, int consumer) {
  int const thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32;
  int const g8 = lane / 4, t4 = lane % 4;
  uint64_t const desc_b = gmma_descriptor(b, 128, 256, 0);
  uint32_t g = 0, stored = 0;  // the CTA's ring rows before this run; rows stored
  float D[2][48], R1[16], R2[16];
  uint32_t a[3][4], al[kThreePass ? 3 : 1][4];  // TF32 (3xTF32: big) and small parts
  for_each_run<kSplitAll>(p, [&](int strip, int n, int k0, int pairs) {
    int const rows = 2 * pairs + kR - 1;
    // NCHW rows landed from a multiple of 4 columns (strip_common.cuh's load_row)
    int const shift = kNhwc ? 0 : (strip_q0(p, strip) + p.pad_w - (kS - 1)) & 3;
    // A fragment of step k of run row j: channels 8 c8 + t4 (+ 4), pixels g8 (+ 8) of the
    // warp's 16, from landed column 64 c + 16 warp + (kS - 1 - s) + shift
    int const col = kCols * consumer + 16 * warp + g8 + shift;
    auto fetch = [&](int j, int k, float(&v)[4]) {
      uint32_t const gj = g + j, slot = gj % kRing;
      if (k == 0 && j < rows) barrier_wait(&landed[slot], (gj / kRing) % 2);
      int const s = k / 4, c8 = k % 4, column = col + (kS - 1 - s);
      float const *row = ring + slot * kRowFloats;
      if constexpr (kNhwc) {
        // float t4 of 16-byte chunk c of column j at 4 (c ^ j % 8) + t4; columns `column` and
        // column + 8 share column % 8
        float const *x = row + column * kCI + t4;
        int const swizzle = 4 * (column % 8);
        v[0] = x[(8 * c8) ^ swizzle];
        v[1] = x[8 * kCI + ((8 * c8) ^ swizzle)];
        v[2] = x[(8 * c8 + 4) ^ swizzle];
        v[3] = x[8 * kCI + ((8 * c8 + 4) ^ swizzle)];
      } else {
        float const *x = row + (8 * c8 + t4) * kPix + column;
        v[0] = x[0];
        v[1] = x[8];
        v[2] = x[4 * kPix];
        v[3] = x[4 * kPix + 8];
      }
    };
    float fetched[2][4];  // kDeferRound: step K's values, fetched at step K - 3
    // The A fragment of step K of the unrolled pair of rows (step k of run row j) into dst
    // (3xTF32: big parts; small, the small ones).
    auto load = [&](int j, int k, int K, uint32_t(&dst)[4], uint32_t(&small)[4]) {
      float v[4];
      if constexpr (kDeferRound) {
#pragma unroll
        for (int f = 0; f < 4; ++f) v[f] = fetched[K % 2][f];
        fetch(j + (k + 1) / 12, (k + 1) % 12, fetched[(K + 1) % 2]);
      } else {
        fetch(j, k, v);
      }
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        dst[f] = tf32_nearest(v[f]);
        if constexpr (kThreePass) small[f] = tf32_nearest(v[f] - __uint_as_float(dst[f]));
      }
    };
    // Input row j - 1 is done (its accumulators d): release it, fold, and store output row
    // j - 3 (relative to the run's first, 2 k0) when it exists.
    auto fold = [&](int j, float(&d)[48]) {
#pragma unroll
      for (int e = 0; e < 48; ++e) cute::warpgroup_fence_operand(d[e]);
      // this thread's ld.shared of the row (generic proxy) before the TMA refill (async)
      fence_async_shared();
      barrier_arrive(&empty[(g + j - 1) % kRing]);
      int const pp = 2 * k0 + j - 3;
      bool const out = j >= 3 && pp < p.P;
      int const s = kStagesPer * consumer + stored % kStagesPer;
      float *const stage = stages + s * kStageFloats;
      if (out) barrier_wait(&stage_empty[s], (stored / kStagesPer + 1) % 2);
#pragma unroll
      for (int j4 = 0; j4 < 4; ++j4) {
        // the bias from shared memory (in registers it made the NHWC form spill)
        float2 const bias = out ? *reinterpret_cast<float2 const *>(sbias + 8 * j4 + 2 * t4)
                                : float2{};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int const i = 4 * j4 + e;
          if (out) {
            int const co = 8 * j4 + 2 * t4 + e % 2, c = 16 * warp + g8 + 8 * (e / 2);
            stage[stage_index(co, c)] = R1[i] + d[i] + (e % 2 ? bias.y : bias.x);
          }
          R1[i] = R2[i] + d[16 + i];
          R2[i] = d[32 + i];
        }
      }
      if (out) {
        if constexpr (kNhwc) fence_async_shared();  // the TMA store reads the stage
        barrier_arrive(&stage_full[s]);
        ++stored;
      }
    };
    // One input row j into accumulators d (the other set, e, holds row j - 1's); steps
    // K0 ... K0 + 11 of the unrolled pair of rows (register set K % 3 of the A fragments).
    auto row = [&](int j, float(&d)[48], float(&e)[48], int K0) {
#pragma unroll
      for (int k = 0; k < 12; ++k) {
        int const K = K0 + k;
        cute::warpgroup_arrive();
        uint64_t const big = desc_b + ((k * kBlockFloats * 4) >> 4);
        if constexpr (kThreePass) {
          uint64_t const small = big + ((kFilterFloats * 4) >> 4);
          wgmma(al[K % 3], big, d, k > 0, std::make_index_sequence<48>{});
          wgmma(a[K % 3], small, d, true, std::make_index_sequence<48>{});
          wgmma(a[K % 3], big, d, true, std::make_index_sequence<48>{});
        } else {
          wgmma(a[K % 3], big, d, k > 0, std::make_index_sequence<48>{});
        }
        cute::warpgroup_commit_batch();
        if (k == 0) {
          cute::warpgroup_wait<0>();
          if (j > 0) fold(j, e);
        } else {
          cute::warpgroup_wait<1>();
        }
        int const jn = j + (k + 2) / 12, kn = (k + 2) % 12;
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          cute::warpgroup_fence_operand(a[(K + 2) % 3][f]);
          cute::warpgroup_fence_operand(al[(K + 2) % 3 % (kThreePass ? 3 : 1)][f]);
        }
        // (past the run's end: a row not waited for, whose values are not used)
        load(jn, kn, K + 2, a[(K + 2) % 3], al[(K + 2) % 3 % (kThreePass ? 3 : 1)]);
      }
    };
#pragma unroll
    for (int i = 0; i < 16; ++i) R1[i] = 0.f, R2[i] = 0.f;
    if constexpr (kDeferRound) fetch(0, 0, fetched[0]);
    load(0, 0, 0, a[0], al[0]);
    load(0, 1, 1, a[1], al[kThreePass ? 1 : 0]);
    for (int j = 0; j < rows; j += 2) {
      row(j, D[0], D[1], 0);
      if (j + 1 < rows) row(j + 1, D[1], D[0], 12);
    }
    cute::warpgroup_wait<0>();
    if (rows % 2) {
      fold(rows, D[0]);
    } else {
      fold(rows, D[1]);
    }
    g += rows;
  });
}

// A storer warp (warp 1 + consumer of warpgroup 0): each output row of its consumer, from its
// stage to y, then frees the stage.
// NCHW: 2 columns per lane of each channel's 64 (fewer where a strip of a narrower image ends
// beyond Q), with 8-byte stores where the row's first column is 8-byte aligned.
// NHWC: lane 0 stores the stage with TMA (the tensor map clips columns beyond Q) and frees it
// once the store has read it, which it waits for one row later (a store's read completes long
// after it is issued), the last at the end.
__device__ void store_rows(StripParams const &p, cute::TmaDescriptor const *tmap_y,
                           float const *stages, uint64_t *stage_full, uint64_t *stage_empty,
                           int consumer) {
  int const lane = threadIdx.x % 32;
  long long const plane = (long long)p.P * p.Q;
  uint32_t stored = 0;
  for_each_run<kSplitAll>(p, [&](int strip, int n, int k0, int pairs) {
    int const q0 = strip_q0(p, strip) + kCols * consumer;
    int const cols = min(kCols, p.Q - q0);  // at most 0 where Q < 128 ends before this half
    for (int pp = 2 * k0; pp < min(2 * (k0 + pairs), p.P); ++pp, ++stored) {
      int const s = kStagesPer * consumer + stored % kStagesPer;
      float const *stage = stages + s * kStageFloats;
      barrier_wait(&stage_full[s], (stored / kStagesPer) % 2);
      if constexpr (kNhwc) {
        if (lane == 0) {
          if (cols > 0) cute::SM90_TMA_STORE_4D::copy(tmap_y, stage, 0, q0, pp, n);
          cute::tma_store_arrive();
          cute::tma_store_wait<1>();  // the previous row's store has read its stage
          if (stored > 0)
            barrier_arrive(&stage_empty[kStagesPer * consumer + (stored - 1) % kStagesPer]);
        }
        continue;
      }
      float *const line = p.y + nchw_offset(p, n, 0, pp, q0) + 2 * lane;
      float const *from = stage + 2 * lane;
      // (8-byte aligned whenever cols == 64: W % 4 == 0 makes Q = W + 2 - 2 pad_w even, and q0
      // is even; checked anyway, so that the stores do not rest on the spec's limits)
      if (cols == kCols && plane % 2 == 0 && (pp * p.Q + q0) % 2 == 0) {
#pragma unroll 8
        for (int co = 0; co < kCO; ++co)
          *reinterpret_cast<float2 *>(line + co * plane) =
              *reinterpret_cast<float2 const *>(from + co * kStagePitch);
      } else {
#pragma unroll 8
        for (int co = 0; co < kCO; ++co) {
          if (2 * lane < cols) line[co * plane] = from[co * kStagePitch];
          if (2 * lane + 1 < cols) line[co * plane + 1] = from[co * kStagePitch + 1];
        }
      }
      __syncwarp();
      if (lane == 0) barrier_arrive(&stage_empty[s]);
    }
  });
  if (kNhwc && lane == 0) cute::tma_store_wait<0>();
}

}  // namespace

// NCHW: tmap_x is x as (W, H, C = 32, N), box (kPix, 1, 32, 1), no swizzle, zero fill; tmap_y
// is not read. NHWC: tmap_x is x as (C = 32, W, H, N), box (32, kPix, 1, 1); tmap_y is y as
// (32, Q, P, N), box (32, 64, 1, 1); both with the 128-byte swizzle, zero fill.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
cutlass_convt_strip_kernel(StripParams const p, __grid_constant__ cute::TmaDescriptor const tmap_x,
                           __grid_constant__ cute::TmaDescriptor const tmap_y) {
  extern __shared__ __align__(1024) float smem[];
  if (kNhwc && smem_address(smem) % 1024 != 0) __trap();  // the 128-byte swizzle's rows need it
  float *b = smem;
  float *ring = b + kFilterCopies * kFilterFloats;
  float *stages = ring + kRing * kRowFloats;
  uint64_t *landed = reinterpret_cast<uint64_t *>(stages + kStages * kStageFloats);
  uint64_t *empty = landed + kRing, *stage_full = empty + kRing;
  uint64_t *stage_empty = stage_full + kStages;
  float *sbias = reinterpret_cast<float *>(stage_empty + kStages);  // kCO floats
  if (threadIdx.x < kRing) {
    barrier_init(&landed[threadIdx.x], 1);
    barrier_init(&empty[threadIdx.x], kConsumers * 128);
  }
  if (threadIdx.x < kStages) {
    barrier_init(&stage_full[threadIdx.x], 128);
    barrier_init(&stage_empty[threadIdx.x], 1);
  }
  fence_async_shared();
  __syncthreads();
  int const warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    if (threadIdx.x == 0) produce(p, &tmap_x, ring, landed, empty);
    int const warp = threadIdx.x / 32;  // warps 1 and 2: one storer per consumer
    if (warp >= 1 && warp <= kConsumers)
      store_rows(p, &tmap_y, stages, stage_full, stage_empty, warp - 1);
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    int const t = threadIdx.x - 128;
    stage_filter<128 * kConsumers>(p.w, b, t);
    if (t < kCO) sbias[t] = p.bias ? p.bias[t] : 0.f;
    asm volatile("bar.sync 4, %0;\n" ::"n"(128 * kConsumers) : "memory");
    consume(p, b, sbias, ring, stages, landed, empty, stage_full, stage_empty, warpgroup - 1);
  }
}

// The output columns q >= p.strips * kTileN, which the host gives to this kernel, launched after
// the strip kernel on the same stream, when Q leaves only a few beyond whole strips (instead of
// a last strip at Q - kTileN that computes and stores kTileN columns again for them;
// docs/design/strip.md, Forms). Plain fp32 on CUDA cores. A block takes kEdgePixels output
// pixels at a time (grid-stride), a lane each; warp k sums the products of input channels
// 8 k ... 8 k + 7 (kPart) for all 32 output channels: it loads x's values of all 9 taps at once
// (zero outside the image; one round trip to memory), and reads the filter from the block's
// copy ([ci][tap][co]) with 16-byte reads that every lane of the warp shares; a tap outside the
// image adds zeros (all 9 taps' FMAs issue: ptxas predicates them, so a vote to skip the taps
// no lane reaches would not remove them). Warps 1-3 leave their sums in shared memory, warp 0
// adds them and writes y in the strip kernel's layout.
constexpr int kEdgeThreads = 128;  // per block of the edge kernel (families/strip.py: EDGE_THREADS)
constexpr int kEdgePixels = 32;    // output pixels per block and round: a warp's lanes
extern "C" __global__ void __launch_bounds__(kEdgeThreads)
cutlass_convt_strip_edge_kernel(StripParams const p, float const *__restrict__ x) {
  constexpr int kTaps = kR * kS, kPer = kCI * kTaps * kCO / kEdgeThreads;
  constexpr int kWarps = kEdgeThreads / 32, kPart = kCI / kWarps;
  static_assert(kCI * kTaps * kCO % kEdgeThreads == 0 && kCI % kWarps == 0 && kPart % 4 == 0,
                "the filter in whole rounds of a block, input channels in 16-byte parts");
  static_assert(kEdgePixels == 32, "a lane per pixel");
  __shared__ __align__(16) float filter[kCI * kTaps * kCO];
  __shared__ float partial[kWarps - 1][kCO][kEdgePixels];  // warps 1-3's sums
  float staged[kPer];  // a thread's filter loads all in flight, in w's (ci, co, tap) order
#pragma unroll
  for (int k = 0; k < kPer; ++k) staged[k] = p.w[threadIdx.x + kEdgeThreads * k];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    int const i = threadIdx.x + kEdgeThreads * k;
    int const tap = i % kTaps, co = i / kTaps % kCO, ci = i / (kTaps * kCO);
    filter[(ci * kTaps + tap) * kCO + co] = staged[k];
  }
  __syncthreads();
  int const q0 = p.strips * kTileN, cols = p.Q - q0;
  int const pixels = p.N * p.P * cols;  // (n, row, column - q0), the column fastest
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32, ci0 = kPart * warp;
  // every thread of the block takes every round (the rounds' __syncthreads)
  for (int u0 = blockIdx.x * kEdgePixels; u0 < pixels; u0 += gridDim.x * kEdgePixels) {
    int const u = u0 + lane, q = q0 + u % cols, pp = u / cols % p.P, n = u / cols / p.P;
    float v[kTaps][kPart];
#pragma unroll
    for (int tap = 0; tap < kTaps; ++tap) {
      int const h = pp + p.pad_h - tap / kS, w = q + p.pad_w - tap % kS;
      bool const in = u < pixels && h >= 0 && h < p.H && w >= 0 && w < p.W;
      if constexpr (kNhwc) {
        float4 const *from = reinterpret_cast<float4 const *>(
            x + ((long long)(n * p.H + h) * p.W + w) * kCI + ci0);
#pragma unroll
        for (int c4 = 0; c4 < kPart / 4; ++c4) {
          float4 const f = in ? from[c4] : float4{};
          v[tap][4 * c4] = f.x, v[tap][4 * c4 + 1] = f.y;
          v[tap][4 * c4 + 2] = f.z, v[tap][4 * c4 + 3] = f.w;
        }
      } else {
#pragma unroll
        for (int c = 0; c < kPart; ++c)
          v[tap][c] = in ? x[((long long)(n * kCI + ci0 + c) * p.H + h) * p.W + w] : 0.f;
      }
    }
    float acc[kCO] = {};
#pragma unroll
    for (int tap = 0; tap < kTaps; ++tap) {
#pragma unroll
      for (int c = 0; c < kPart; ++c) {
        float4 const *f =
            reinterpret_cast<float4 const *>(filter + ((ci0 + c) * kTaps + tap) * kCO);
#pragma unroll
        for (int c4 = 0; c4 < kCO / 4; ++c4) {
          float4 const a = f[c4];
          acc[4 * c4] = fmaf(v[tap][c], a.x, acc[4 * c4]);
          acc[4 * c4 + 1] = fmaf(v[tap][c], a.y, acc[4 * c4 + 1]);
          acc[4 * c4 + 2] = fmaf(v[tap][c], a.z, acc[4 * c4 + 2]);
          acc[4 * c4 + 3] = fmaf(v[tap][c], a.w, acc[4 * c4 + 3]);
        }
      }
    }
    if (warp > 0) {
#pragma unroll
      for (int co = 0; co < kCO; ++co) partial[warp - 1][co][lane] = acc[co];
    }
    __syncthreads();
    if (warp == 0 && u < pixels) {
#pragma unroll
      for (int co = 0; co < kCO; ++co) {
        float sum = acc[co] + (p.bias ? p.bias[co] : 0.f);
#pragma unroll
        for (int k = 0; k < kWarps - 1; ++k) sum += partial[k][co][lane];
        acc[co] = sum;
      }
      if constexpr (kNhwc) {
        float4 *to = reinterpret_cast<float4 *>(p.y + ((long long)(n * p.P + pp) * p.Q + q) * kCO);
#pragma unroll
        for (int c4 = 0; c4 < kCO / 4; ++c4)
          to[c4] = make_float4(acc[4 * c4], acc[4 * c4 + 1], acc[4 * c4 + 2], acc[4 * c4 + 3]);
      } else {
#pragma unroll
        for (int co = 0; co < kCO; ++co) p.y[nchw_offset(p, n, co, pp, q)] = acc[co];
      }
    }
    __syncthreads();  // warp 0 has read the sums before the next round writes them
  }
}

// cutlass_convt: the strip family's "rs" form (StripConfig, mma = "rs"), a stride-1
// transposed convolution on NCHW or NHWC (channels_last) tensors, C_in = C_out = 32, R = S = 3,
// float32 in TF32 or 3xTF32, float16 or bfloat16 (their wgmma, float32 sums), for SM90 (wgmma +
// TMA), with x as wgmma's A operand from registers: no transpose pass; and at the end of this
// file its edge kernel (the few output columns beyond whole strips, on CUDA cores).
// docs/design/strip.md describes both.
//
//   y[n, co, p, q] = bias[co]
//                    + sum_{ci, r, s} x[n, ci, p + pad_h - r, q + pad_w - s] * w[ci, co, r, s]
//
// A CTA walks strips and runs of pairs of output rows as strip.cu's, or with kSplitAll
// over the units of all strips split evenly among the CTAs (strip_common.cuh's for_each_run):
// warpgroup 0's thread 0 loads input rows with TMA (kPix columns x 32 channels; NCHW as
// [channel][column], NHWC as [column][channel] with the 128-byte swizzle, 16-bit the 64-byte
// one) into a ring of kRing
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
// y: NCHW from [channel][column] with stores of two elements (NCHW rows are not 16-byte
// aligned), NHWC from [column][channel] (the swizzle) with a TMA store, clipped at the image's
// edge.
// ptxas dictates this loop's shape: accumulators cannot rotate through registers (C7511), and
// the previous row's accumulators can be read only right after a wait<0> at a row's first step
// (read anywhere else, ptxas serializes every wgmma, C7514, which build.py takes for a failed
// build).
// 16-bit elements (kHalf, kBf16): 6 steps per input row (16 channels c16, filter column s; the
// kS steps of a c16 in a row), one m64n96k16 each, y rounded once from the float32 sums. An A
// register is two channels of one pixel: NHWC reads it as one word (64-byte swizzle, 64-byte
// pixel rows); NCHW has a thread's two A rows take neighbouring output columns (row g8 ->
// column 2 g8, row g8 + 8 -> 2 g8 + 1), so that one word of a channel's row holds both, and
// builds a c16's fragments of all kS steps from 3 words per channel (funnel shifts for an odd
// column, byte permutes to pair the channels).
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common.cuh"  // tf32_nearest, mbarrier helpers, fence_async_shared, gmma_descriptor
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "config.h"  // kS kTileN kRing kStageRows kPrepGroups kSharedBytes kNhwc kThreePass
                     // kSplitAll kHalf kBf16 (from StripConfig)
#include "strip_common.cuh"  // StripParams, the walk, input-row loads, Element

namespace {

static_assert(kTileN == 128 && kRing >= 6 && kStageRows == 1 && kPrepGroups == 0 && kS == 3,
              "StripConfig's rs form: 2 x 64 columns, 6 or more ring rows, S = 3");
// strips kTileN apart (the edge kernel takes the columns from p.strips * kTileN on)
static_assert(kStripStep == kTileN, "StripConfig.strip_step");
constexpr int kCols = 64;  // output columns per consumer
constexpr int kConsumers = kTileN / kCols;
static_assert(!(kSixteen && kThreePass), "3xTF32 is float32's");
// NCHW: a warp's A loads (8 columns x 4 channels kPix words apart; 16-bit: 8 words of column
// pairs x 4 channel pairs, kPix words apart) hit 32 banks; NHWC: the swizzle sees to it
static_assert(kNhwc || kPix % 32 == 8 || kPix % 32 == 24, "bank conflicts");
constexpr int kK = kSixteen ? 16 : 8;  // channels of a wgmma step
constexpr int kSteps = kS * (kCI / kK);  // steps of an input row: 12 (TF32) or 6 (16-bit)
// Step k's filter column and channel block: TF32 s-major (k = 4 s + c8), 16-bit c16-major
// (k = kS c16 + s: NCHW builds a c16's fragments of all its s at once).
__device__ __forceinline__ constexpr int step_s(int k) {
  return kSixteen ? k % kS : k / (kCI / kK);
}
__device__ __forceinline__ constexpr int step_c(int k) {
  return kSixteen ? k / kS : k % (kCI / kK);
}
constexpr int kBlockElems = kR * kCO * kK;  // B block of a step: 96 n x kK k
constexpr int kFilterElems = kSteps * kBlockElems;
constexpr int kFilterCopies = kThreePass ? 2 : 1;  // 3xTF32: the big parts, then the small ones
// 16-bit NCHW: A rows g8 and g8 + 8 of a warp take output columns 2 g8 and 2 g8 + 1 of its 16
constexpr bool kColumnPairs = kSixteen && !kNhwc;
// A stage holds an output row of a consumer: NCHW [co][column], a pitch of 68 floats (2 x pitch
// = 8 (mod 32) words, so a warp's writes, co of 2 t4 x column g8, hit 32 banks) or 72 16-bit
// elements (36 words: the same for co of 2 t4 x the word of columns 2 g8, 2 g8 + 1); NHWC
// [column][co] with the 128-byte swizzle (16-byte chunk c of column j at c ^ j % 8; 16-bit:
// the 64-byte swizzle, chunk c of column j at c ^ j / 2 % 4), as the TMA store reads it.
constexpr int kStagePitch = kCols + (kSixteen ? 8 : 4);
constexpr int kStageElems = kNhwc ? kCols * kCO : kCO * kStagePitch;
__device__ __forceinline__ int stage_index(int co, int column) {
  if constexpr (kNhwc && kSixteen)
    return column * kCO + ((co / 8) ^ (column / 2 % 4)) * 8 + co % 8;
  else if constexpr (kNhwc)
    return column * kCO + ((co / 4) ^ (column % 8)) * 4 + co % 4;
  else
    return co * kStagePitch + column;
}
// The A fragments' shared-memory loads one step ahead of their rounding (so that a step's
// rounding does not wait for its loads), except for 3xTF32 on NHWC, where the deferral does not
// pay (docs/design/strip.md, Defaults); 16-bit elements have no rounding.
constexpr bool kDeferRound = !kSixteen && !(kNhwc && kThreePass);
constexpr int kStagesPer = 2;                                     // stages per consumer
constexpr int kStages = kStagesPer * kConsumers;
constexpr int kThreads = 128 * (1 + kConsumers);
// setmaxnreg: the producer warpgroup (the TMA issuer and the storer warps) gives registers to
// the consumers (168 each at launch; the counts may sum to the launch's pool). NHWC's storers
// only issue TMA stores, so its consumers take more (ptxas: 0 spills at these counts; the NHWC
// consumers spill at 208, the NCHW storers at 40).
constexpr int kProducerRegs = kNhwc ? 40 : 88, kConsumerRegs = kNhwc ? 232 : 208;
static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (1 + kConsumers) * 168, "the pool");
constexpr int kElementBytes = int(sizeof(Element));
static_assert(kElementBytes *
                          (kFilterCopies * kFilterElems + kRing * kRowElems +
                           kStages * kStageElems) +
                      8 * (2 * kRing + 2 * kStages) + 4 * kCO ==
                  kSharedBytes,
              "shared memory layout differs from StripConfig's");
constexpr CacheHint kLoadHint = CacheHint::EVICT_NORMAL;
// the swizzle's atom: 8 rows of its width
constexpr int kSwizzleAtom = kSixteen ? 512 : 1024;
static_assert(!kNhwc || (kFilterCopies * kFilterElems * kElementBytes % kSwizzleAtom == 0 &&
                         kRowElems * kElementBytes % kSwizzleAtom == 0 &&
                         kStageElems * kElementBytes % kSwizzleAtom == 0),
              "NHWC: ring rows and stages start at multiples of the swizzle's atom");

using Op = std::conditional_t<
    kBf16, cute::SM90::GMMA::MMA_64x96x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,
                                                         cute::SM90::GMMA::Major::K>,
    std::conditional_t<kHalf,
                       cute::SM90::GMMA::MMA_64x96x16_F32F16F16_RS<cute::SM90::GMMA::Major::K,
                                                                   cute::SM90::GMMA::Major::K>,
                       cute::SM90::GMMA::MMA_64x96x8_F32TF32TF32_RS_TN<>>>;
template <std::size_t... I>
__device__ __forceinline__ void wgmma(uint32_t const (&a)[4], uint64_t db, float (&d)[48],
                                      bool accumulate, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], db, d[I]...,
          accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero);
}

// B blocks (s, c) of the steps: n = 32 r + co, k = ci - kK c; core matrices of 8 n x kAlign k
// (16-byte rows), core (n / 8, k / kAlign) at byte 128 (2 (n / 8) + k / kAlign); TF32: rounded
// (3xTF32: the big parts, then the small ones); 16-bit: the elements as they are. Staged by
// kStagers threads (t of them), each with all its loads in flight before it stores (as
// strip.cu's stage_filter).
template <int kStagers>
__device__ __forceinline__ void stage_filter(Element const *__restrict__ w, Element *b, int t) {
  constexpr int kPer = (kFilterElems + kStagers - 1) / kStagers, kCore = 8 * kAlign;
  Element v[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    int const i = t + kStagers * j;
    int const block = i / kBlockElems, in = i % kBlockElems;
    int const s = step_s(block), c = step_c(block);
    int const core = in / kCore, n = core / 2 * 8 + in % kCore / kAlign;
    int const k = core % 2 * kAlign + in % kAlign;
    int const r = n / kCO, co = n % kCO, ci = kK * c + k;
    v[j] = i < kFilterElems ? w[(ci * kCO + co) * (kR * kS) + r * kS + s] : Element{};
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    int const i = t + kStagers * j;
    if (i < kFilterElems) {
      if constexpr (kSixteen) {
        b[i] = v[j];
      } else {
        uint32_t const big = tf32_nearest(v[j]);
        b[i] = __uint_as_float(big);
        if constexpr (kThreePass)
          b[kFilterElems + i] = __uint_as_float(tf32_nearest(v[j] - __uint_as_float(big)));
      }
    }
  }
  fence_async_shared();
}

// Thread 0: rows of a run, input rows 2 k0 + pad_h - 2 ... (2 pairs + 2 rows); the g-th row of
// the CTA goes to ring slot g % kRing.
__device__ void produce(StripParams const &p, cute::TmaDescriptor const *tmap_x, Element *ring,
                        uint64_t *landed, uint64_t *empty) {
  uint32_t g = 0;
  for_each_run<kSplitAll>(p, [&](int strip, int n, int k0, int pairs) {
    int const rows = 2 * pairs + kR - 1, h0 = 2 * k0 + p.pad_h - (kR - 1);
    int const w0 = strip_q0(p, strip) + p.pad_w - (kS - 1);
#pragma unroll 1  // (unrolled, the NHWC producer spills at its 40 registers)
    for (int j = 0; j < rows; ++j, ++g)
      load_row<kRing>(tmap_x, ring + g % kRing * kRowElems, landed, empty, g, kLoadHint,
                      kNhwc ? w0 : w0 & ~(kAlign - 1), h0 + j, n);
  });
}

// Consumer warpgroup c: output columns q0 + 64 c ... + 63 of the CTA's strip. Accumulator
// 4 j + e of a thread: pixel 16 warp + lane / 4 + 8 (e / 2) (kColumnPairs: 16 warp +
// 2 (lane / 4) + e / 2), n = 8 j + 2 (lane % 4) + e % 2 (filter row n / 32, channel n % 32).
__device__ void consume(StripParams const &p, Element const *b, float const *sbias,
                        Element *ring, Element *stages,
                        uint64_t *landed, uint64_t *empty, uint64_t *stage_full,
                        uint64_t *stage_empty, int consumer) {
  int const thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32;
  int const g8 = lane / 4, t4 = lane % 4;
  uint64_t const desc_b = gmma_descriptor(b, 128, 256, 0);
  uint32_t g = 0, stored = 0;  // the CTA's ring rows before this run; rows stored
  float D[2][48], R1[16], R2[16];
  uint32_t a[3][4], al[kThreePass ? 3 : 1][4];  // TF32 (3xTF32: big) and small parts
  // kColumnPairs: a c16's column pairs (c0 + i, its channel pair), i = 0 ... 3, of channels
  // 16 c16 + 2 t4 (+ 1) and + 8 (+ 9)
  uint32_t pairs_of[2][4];
  for_each_run<kSplitAll>(p, [&](int strip, int n, int k0, int pairs) {
    int const rows = 2 * pairs + kR - 1;
    // NCHW rows landed from a multiple of kAlign columns (strip_common.cuh's load_row)
    int const shift = kNhwc ? 0 : (strip_q0(p, strip) + p.pad_w - (kS - 1)) & (kAlign - 1);
    // A fragment of step k of run row j: channels of (s, c), pixels g8 (+ 8) of the warp's 16
    // (kColumnPairs: 2 g8 (+ 1)), from landed column 64 c + 16 warp + (kS - 1 - s) + shift
    int const col = kCols * consumer + 16 * warp + (kColumnPairs ? 2 * g8 : g8) + shift;
    auto wait_row = [&](int j, int k) {
      uint32_t const gj = g + j, slot = gj % kRing;
      if (k == 0 && j < rows) barrier_wait(&landed[slot], (gj / kRing) % 2);
      return ring + slot * kRowElems;
    };
    // TF32: the floats of step k's A fragment
    auto fetch = [&](int j, int k, float(&v)[4]) {
      float const *row = reinterpret_cast<float const *>(wait_row(j, k));
      int const s = step_s(k), c8 = step_c(k), column = col + (kS - 1 - s);
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
    // 16-bit: step k's A fragment, words of two channels of a pixel
    auto fetch16 = [&](int j, int k, uint32_t(&v)[4]) {
      Element const *row = wait_row(j, k);
      int const s = step_s(k), c16 = step_c(k);
      if constexpr (kNhwc) {
        // word t4 of 16-byte chunk c of column j at 4 (c ^ j / 2 % 4) + t4; columns `column`
        // and column + 8 share column / 2 % 4
        int const column = col + (kS - 1 - s), swizzle = column / 2 % 4;
        uint32_t const *x = reinterpret_cast<uint32_t const *>(row + column * kCI) + t4;
        v[0] = x[4 * ((2 * c16) ^ swizzle)];
        v[1] = x[8 * kCI / 2 + 4 * ((2 * c16) ^ swizzle)];
        v[2] = x[4 * ((2 * c16 + 1) ^ swizzle)];
        v[3] = x[8 * kCI / 2 + 4 * ((2 * c16 + 1) ^ swizzle)];
      } else {
        if (s == 0) {
          // columns col ... col + 3 of channels ch, ch + 1, ch + 8, ch + 9: 3 words from the
          // even column at or before col, shifted by one column where col is odd
          int const odd = col & 1;
          uint32_t const *x = reinterpret_cast<uint32_t const *>(row) + (col - odd) / 2;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t w[2][3];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              uint32_t const *from = x + (16 * c16 + 2 * t4 + 8 * h + e) * kPix / 2;
#pragma unroll
              for (int i = 0; i < 3; ++i) w[e][i] = from[i];
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              uint32_t const lo = __funnelshift_r(w[0][i], w[0][i + 1], 16 * odd);
              uint32_t const hi = __funnelshift_r(w[1][i], w[1][i + 1], 16 * odd);
              pairs_of[h][2 * i] = __byte_perm(lo, hi, 0x5410);
              pairs_of[h][2 * i + 1] = __byte_perm(lo, hi, 0x7632);
            }
          }
        }
        // step s reads columns col + kS - 1 - s (row g8) and the next (row g8 + 8)
        v[0] = pairs_of[0][kS - 1 - s];
        v[1] = pairs_of[0][kS - s];
        v[2] = pairs_of[1][kS - 1 - s];
        v[3] = pairs_of[1][kS - s];
      }
    };
    float fetched[2][4];  // kDeferRound: step K's values, fetched at step K - 3
    // The A fragment of step K of the unrolled pair of rows (step k of run row j) into dst
    // (3xTF32: big parts; small, the small ones).
    auto load = [&](int j, int k, int K, uint32_t(&dst)[4], uint32_t(&small)[4]) {
      if constexpr (kSixteen) {
        fetch16(j, k, dst);
      } else {
        float v[4];
        if constexpr (kDeferRound) {
#pragma unroll
          for (int f = 0; f < 4; ++f) v[f] = fetched[K % 2][f];
          fetch(j + (k + 1) / kSteps, (k + 1) % kSteps, fetched[(K + 1) % 2]);
        } else {
          fetch(j, k, v);
        }
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          dst[f] = tf32_nearest(v[f]);
          if constexpr (kThreePass) small[f] = tf32_nearest(v[f] - __uint_as_float(dst[f]));
        }
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
      Element *const stage = stages + s * kStageElems;
      if (out) barrier_wait(&stage_empty[s], (stored / kStagesPer + 1) % 2);
#pragma unroll
      for (int j4 = 0; j4 < 4; ++j4) {
        // the bias from shared memory (in registers it made the NHWC form spill)
        float2 const bias = out ? *reinterpret_cast<float2 const *>(sbias + 8 * j4 + 2 * t4)
                                : float2{};
        float v[4];  // 16-bit: the sums of accumulators 4 j4 ... + 3, stored in pairs
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int const i = 4 * j4 + e;
          if constexpr (kSixteen) {
            v[e] = R1[i] + d[i] + (e % 2 ? bias.y : bias.x);
          } else if (out) {
            int const co = 8 * j4 + 2 * t4 + e % 2, c = 16 * warp + g8 + 8 * (e / 2);
            stage[stage_index(co, c)] = R1[i] + d[i] + (e % 2 ? bias.y : bias.x);
          }
          R1[i] = R2[i] + d[16 + i];
          R2[i] = d[32 + i];
        }
        if constexpr (kSixteen) {
          if (out) {
            uint32_t *const words = reinterpret_cast<uint32_t *>(stage);
            int const co = 8 * j4 + 2 * t4;
            if constexpr (kNhwc) {  // channels co, co + 1 of columns c, c + 8
              int const c = 16 * warp + g8;
              words[stage_index(co, c) / 2] = pack_pair(v[0], v[1]);
              words[stage_index(co, c + 8) / 2] = pack_pair(v[2], v[3]);
            } else {  // columns c, c + 1 of channels co, co + 1
              int const c = 16 * warp + 2 * g8;
              words[stage_index(co, c) / 2] = pack_pair(v[0], v[2]);
              words[stage_index(co + 1, c) / 2] = pack_pair(v[1], v[3]);
            }
          }
        }
      }
      if (out) {
        if constexpr (kNhwc) fence_async_shared();  // the TMA store reads the stage
        barrier_arrive(&stage_full[s]);
        ++stored;
      }
    };
    // One input row j into accumulators d (the other set, e, holds row j - 1's); steps
    // K0 ... K0 + kSteps - 1 of the unrolled pair of rows (register set K % 3 of the A
    // fragments).
    auto row = [&](int j, float(&d)[48], float(&e)[48], int K0) {
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {
        int const K = K0 + k;
        cute::warpgroup_arrive();
        uint64_t const big = desc_b + ((k * kBlockElems * kElementBytes) >> 4);
        if constexpr (kThreePass) {
          uint64_t const small = big + ((kFilterElems * 4) >> 4);
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
        int const jn = j + (k + 2) / kSteps, kn = (k + 2) % kSteps;
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
      if (j + 1 < rows) row(j + 1, D[1], D[0], kSteps);
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
// beyond Q), with stores of both where the row's first column is even (aligned to 2 elements).
// NHWC: lane 0 stores the stage with TMA (the tensor map clips columns beyond Q) and frees it
// once the store has read it, which it waits for one row later (a store's read completes long
// after it is issued), the last at the end.
__device__ void store_rows(StripParams const &p, cute::TmaDescriptor const *tmap_y,
                           Element const *stages, uint64_t *stage_full, uint64_t *stage_empty,
                           int consumer) {
  int const lane = threadIdx.x % 32;
  long long const plane = (long long)p.P * p.Q;
  uint32_t stored = 0;
  for_each_run<kSplitAll>(p, [&](int strip, int n, int k0, int pairs) {
    int const q0 = strip_q0(p, strip) + kCols * consumer;
    int const cols = min(kCols, p.Q - q0);  // at most 0 where Q < 128 ends before this half
    for (int pp = 2 * k0; pp < min(2 * (k0 + pairs), p.P); ++pp, ++stored) {
      int const s = kStagesPer * consumer + stored % kStagesPer;
      Element const *stage = stages + s * kStageElems;
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
      Element *const line = p.y + nchw_offset(p, n, 0, pp, q0) + 2 * lane;
      Element const *from = stage + 2 * lane;
      // (aligned whenever cols == 64: W % 4 == 0 makes Q = W + 2 - 2 pad_w even, and q0 is
      // even; checked anyway, so that the stores do not rest on the spec's limits)
      using Two = std::conditional_t<kSixteen, uint32_t, float2>;  // two elements
      if (cols == kCols && plane % 2 == 0 && (pp * p.Q + q0) % 2 == 0) {
#pragma unroll 8
        for (int co = 0; co < kCO; ++co)
          *reinterpret_cast<Two *>(line + co * plane) =
              *reinterpret_cast<Two const *>(from + co * kStagePitch);
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

// Both maps of Element. NCHW: tmap_x is x as (W, H, C = 32, N), box (kPix, 1, 32, 1), no
// swizzle, zero fill; tmap_y is not read. NHWC: tmap_x is x as (C = 32, W, H, N), box
// (32, kPix, 1, 1); tmap_y is y as (32, Q, P, N), box (32, 64, 1, 1); both with the 128-byte
// swizzle (16-bit: the 64-byte swizzle), zero fill.
extern "C" __global__ void __launch_bounds__(kThreads, 1)
cutlass_convt_strip_kernel(StripParams const p, __grid_constant__ cute::TmaDescriptor const tmap_x,
                           __grid_constant__ cute::TmaDescriptor const tmap_y) {
  extern __shared__ __align__(1024) unsigned char smem[];
  if (kNhwc && smem_address(smem) % 1024 != 0) __trap();  // the swizzle's rows need it
  Element *b = reinterpret_cast<Element *>(smem);
  Element *ring = b + kFilterCopies * kFilterElems;
  Element *stages = ring + kRing * kRowElems;
  uint64_t *landed = reinterpret_cast<uint64_t *>(stages + kStages * kStageElems);
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
    if (t < kCO) sbias[t] = p.bias ? to_float(p.bias[t]) : 0.f;
    asm volatile("bar.sync 4, %0;\n" ::"n"(128 * kConsumers) : "memory");
    consume(p, b, sbias, ring, stages, landed, empty, stage_full, stage_empty, warpgroup - 1);
  }
}

// The output columns q >= p.strips * kTileN, which the host gives to this kernel, launched after
// the strip kernel on the same stream, when Q leaves only a few beyond whole strips (instead of
// a last strip at Q - kTileN that computes and stores kTileN columns again for them;
// docs/design/strip.md, Forms). Plain fp32 on CUDA cores (16-bit elements converted to float32 as
// they are loaded, y rounded once). A block takes kEdgePixels output
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
cutlass_convt_strip_edge_kernel(StripParams const p, Element const *__restrict__ x) {
  constexpr int kTaps = kR * kS, kPer = kCI * kTaps * kCO / kEdgeThreads;
  constexpr int kWarps = kEdgeThreads / 32, kPart = kCI / kWarps;
  static_assert(kCI * kTaps * kCO % kEdgeThreads == 0 && kCI % kWarps == 0 &&
                    kPart % 8 == 0,
                "the filter in whole rounds of a block, input channels in 16-byte parts");
  static_assert(kEdgePixels == 32, "a lane per pixel");
  __shared__ __align__(16) float filter[kCI * kTaps * kCO];
  __shared__ float partial[kWarps - 1][kCO][kEdgePixels];  // warps 1-3's sums
  Element staged[kPer];  // a thread's filter loads all in flight, in w's (ci, co, tap) order
#pragma unroll
  for (int k = 0; k < kPer; ++k) staged[k] = p.w[threadIdx.x + kEdgeThreads * k];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    int const i = threadIdx.x + kEdgeThreads * k;
    int const tap = i % kTaps, co = i / kTaps % kCO, ci = i / (kTaps * kCO);
    filter[(ci * kTaps + tap) * kCO + co] = to_float(staged[k]);
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
      Element const *pixel = x + ((long long)(n * p.H + h) * p.W + w) * kCI + ci0;
      if constexpr (kNhwc && kSixteen) {  // kPart channels in 16-byte loads of 8
#pragma unroll
        for (int c8 = 0; c8 < kPart / 8; ++c8) {
          uint4 const f = in ? reinterpret_cast<uint4 const *>(pixel)[c8] : uint4{};
          uint32_t const words[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
          for (int i = 0; i < 8; ++i)
            v[tap][8 * c8 + i] =
                to_float(reinterpret_cast<Element const *>(&words[i / 2])[i % 2]);
        }
      } else if constexpr (kNhwc) {  // kPart channels in 16-byte loads of 4
        float4 const *from = reinterpret_cast<float4 const *>(pixel);
#pragma unroll
        for (int c4 = 0; c4 < kPart / 4; ++c4) {
          float4 const f = in ? from[c4] : float4{};
          v[tap][4 * c4] = f.x, v[tap][4 * c4 + 1] = f.y;
          v[tap][4 * c4 + 2] = f.z, v[tap][4 * c4 + 3] = f.w;
        }
      } else {
#pragma unroll
        for (int c = 0; c < kPart; ++c)
          v[tap][c] =
              in ? to_float(x[((long long)(n * kCI + ci0 + c) * p.H + h) * p.W + w]) : 0.f;
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
        float sum = acc[co] + (p.bias ? to_float(p.bias[co]) : 0.f);
#pragma unroll
        for (int k = 0; k < kWarps - 1; ++k) sum += partial[k][co][lane];
        acc[co] = sum;
      }
      Element *const to = p.y + ((long long)(n * p.P + pp) * p.Q + q) * kCO;
      if constexpr (kNhwc && kSixteen) {
#pragma unroll
        for (int c2 = 0; c2 < kCO / 2; ++c2) store_pair(to + 2 * c2, acc[2 * c2], acc[2 * c2 + 1]);
      } else if constexpr (kNhwc) {
#pragma unroll
        for (int c4 = 0; c4 < kCO / 4; ++c4)
          reinterpret_cast<float4 *>(to)[c4] =
              make_float4(acc[4 * c4], acc[4 * c4 + 1], acc[4 * c4 + 2], acc[4 * c4 + 3]);
      } else {
#pragma unroll
        for (int co = 0; co < kCO; ++co) p.y[nchw_offset(p, n, co, pp, q)] = from_float(acc[co]);
      }
    }
    __syncthreads();  // warp 0 has read the sums before the next round writes them
  }
}

// cutlass_convt: the "strip" family's "ss" form, a stride-1 transposed convolution on NHWC
// (channels_last) or NCHW tensors, TF32, C_in = C_out = 32, R = 3, for SM90 (wgmma + TMA).
// docs/design/strip.md describes the algorithm, its limits and its defaults.
//
//   y[n, p, q, co] = bias[co]
//                    + sum_{ci, r, s} x[n, p + pad_h - r, q + pad_w - s, ci] * w[ci, co, r, s]
//
// The GEMM is transposed against the direct family's: wgmma's A operand is the filter, M = 64 =
// 2 output rows x 32 output channels (blocks [W(r, s); W(r + 1, s)] of 32 x 32, zero blocks at
// the ends, TF32-rounded once into shared memory); B is the input, N = kTileN output columns,
// K = 8 input channels, read from shared memory rows of 32 channels (128 bytes) per pixel in
// GMMA's 128-byte-swizzled K-major layout, so filter column s is a 128-byte shift of the
// descriptor's start address (the swizzle follows the address bits, so shifted starts read the
// same data). One m64nNk8 per (input row, filter column, 8 channels): 4 input rows x kS x 4 per
// pair of output rows; the first kRegisterA of them take A from registers instead (wgmma's RS
// form, the fragments loaded once per CTA), which takes their filter reads off the
// shared-memory port that binds the kernel (docs/design/strip.md, What binds it).
//
// Persistent and warp-specialized: each CTA takes vertical strips of kTileN output columns
// (kStripStep apart: NHWC kTileN, NCHW the body width below) and,
// in each, a range of (image, pair of output rows) top to bottom. Warpgroup 0 loads input rows
// (kTileN + kS - 1 columns plus alignment, all 32 channels, zero outside the image) with TMA into
// a ring of kRing rows (one thread issues). Warps 1-3 (and with kPrepGroups = 1 a fourth
// warpgroup) round each landed row to TF32 in place:
// NHWC rows land in the swizzled layout already (TMA's 128-byte swizzle); NCHW rows land as
// [channel][pixel] and are transposed into it by the same pass (TF32 wgmma reads B K-major only).
// Two consumer warpgroups take turns at pairs, and each interior input row serves two pairs.
// A consumer writes its pair's two output rows to shared memory and stores them with TMA: NHWC
// in the swizzled layout, clipped at the image's edges by the tensor map; NCHW as [channel]
// [column] boxes of y's planes seen as flat rows of P x Q floats (NCHW rows of Q floats are not
// 16-byte multiples, which a TMA tensor's strides must be), two boxes per output row, of its 16
// even and of its 16 odd channels, each starting at the strip's first 32-byte aligned column of
// the row in those planes (planes of P x Q floats are 16-byte multiples, so the odd ones may be
// 16 bytes off the even ones) and p.body columns (whole sectors; kStripStep when Q >= kTileN)
// wide: pieces of whole sectors store at channels_last's rate, pieces 16 bytes off a sector do
// not. NCHW strips are kStripStep apart, so all strips of a row have the same heads (columns
// before the bodies), the bodies of neighbouring strips abut, and only the row's two ends (the
// first strip's heads, the last strip's columns after its bodies) are stored from the
// registers, never the ends of every strip (docs/design/strip.md, Layouts).
// mbarriers: landed[slot] (TMA bytes arrived), full[slot] (rounded), empty[slot] (both pairs
// that read the row are done with it: each input row's wgmmas of a pair are a commit group, and
// the slot is released as that group completes; a consumer waits for the pair's newest row only
// after it has issued the older rows' wgmmas).
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common.cuh"  // tf32_nearest, mbarrier helpers, fence_async_shared, gmma_descriptor
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cute/arch/mma_sm90_gmma_ext.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "config.h"  // kS kTileN kStripStep kRing kStageRows kPrepGroups kRegisterA
                     // kSharedBytes kNhwc kThreePass kSplitAll (from StripConfig)
#include "strip_common.cuh"  // StripParams, the walk, input-row loads

namespace {

constexpr int kPairRows = 2;  // output rows per pair (M = 64)
static_assert(!kThreePass && !kSplitAll && !kSixteen,
              "3xTF32, 16-bit elements and the split of all strips are strip_rs.cu's");
// NCHW: the most columns of an output row that leave by TMA (its bodies: whole 32-byte sectors,
// 8 or 24 floats mod 32 wide, so that the stage writes below meet at most 2-way bank conflicts).
constexpr int kBodyMax = kStripStep;
static_assert(kNhwc ? kStripStep == kTileN
                    : kStripStep % 8 == 0 && kStripStep <= kTileN - 7 &&
                          (kStripStep % 32 == 8 || kStripStep % 32 == 24),
              "StripConfig.strip_step");
constexpr int kBlocks = (kPairRows - 1) + kS * (kR + kPairRows - 1);
constexpr int kAFloats = kBlocks * kCO * kCI;
// The first of the two filter blocks (rows of A) of the wgmmas of input row i of a pair (0 to
// kR) and filter column s (A's layout: stage_filter below)
constexpr int filter_block(int i, int s) {
  return (kPairRows - 1) + s * (kR + kPairRows - 1) + (kR - 1 - i);
}
// Row (of 16 bytes: 4 k) of A's [c4][m][4] layout that holds channels 4 c4 ... 4 c4 + 3 of row m
constexpr int filter_row(int c4, int m) { return c4 * kBlocks * kCO + m; }
// A consumer's rows: kStripStep columns (NHWC: kTileN; NCHW: kBodyMax) x kCO channels each.
constexpr int kStageFloats = kStageRows * kCO * kStripStep;
constexpr int kConsumers = 2;
// Threads that prepare rows (round, or transpose, them): warps 1-3 and kPrepGroups more
// warpgroups after the consumers.
static_assert(kPrepGroups == 0 || kPrepGroups == 1, "StripConfig.prep_groups");
constexpr int kPrepThreads = 96 + 128 * kPrepGroups;
constexpr int kExtraPrep = 128 * (1 + kConsumers);  // first thread of the extra warpgroup
constexpr int kThreads = 128 * (1 + kConsumers + kPrepGroups);
// With the extra warpgroup (512 threads, so 128 registers per thread at launch), or with A
// fragments in registers (kRegisterA, below; 384 threads, 168 registers at launch), setmaxnreg
// moves registers from the preparing warpgroups to the consumers. The CTA keeps the registers
// of its launch, so the counts may sum to at most 4 x 128 or 3 x 168 per thread (a
// setmaxnreg.inc beyond that waits forever). ptxas at 384 threads: the preparing threads spill
// at 72, the consumers hold 16 A fragments without spills at 208 and spill with 20.
static_assert(kRegisterA == 0 || kPrepGroups == 0, "StripConfig.register_a");
constexpr bool kReconfigure = kPrepGroups > 0 || kRegisterA > 0;
constexpr int kPrepRegs = kPrepGroups > 0 ? 64 : 88, kConsumerRegs = kPrepGroups > 0 ? 192 : 208;
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;  // per thread, in units of 8
static_assert((1 + kPrepGroups) * kPrepRegs + kConsumers * kConsumerRegs <=
                  kThreads / 128 * kLaunchRegs,
              "the CTA's pool");
constexpr int kAcc = kTileN / 2;                              // accumulators per thread
static_assert(kTileN % 8 == 0 && kAFloats * 4 % 1024 == 0, "1024-byte aligned rows");
static_assert(4 * (kAFloats + kRing * kRowElems + kConsumers * kStageFloats) + 3 * kRing * 8 ==
                  kSharedBytes,
              "shared memory layout differs from StripConfig's");
// Two pairs in flight hold 6 rows. (Below 5 rows a consumer could also pass a stale `full`
// phase of a slot and read a row that has not landed.)
static_assert(kRing >= 6, "two pairs in flight hold 6 rows");
static_assert(kStageRows == 1 || kStageRows == 2, "a pair leaves in one or two stores");
// L2 eviction priorities: channels_last keeps x's rows in L2 longer (the neighbouring strips'
// CTAs and the next CTA of the same strip read their edge columns and rows again); NCHW keeps
// the output pieces in L2 longer (the neighbouring strips' pieces of the same rows arrive
// later). docs/design/strip.md, Layouts.
constexpr CacheHint kLoadHint = kNhwc ? CacheHint::EVICT_LAST : CacheHint::EVICT_NORMAL;
constexpr CacheHint kNchwStoreHint = CacheHint::EVICT_LAST;
// NCHW: columns of output row `row` of a strip before its body in the planes of channel parity
// `odd`, whose start is 32-byte aligned in y (torch allocates y 512-byte aligned; 16 bytes, all
// that the TMA store needs, hold for any y the launch takes; planes of P x Q floats are 16-byte
// multiples, StripFamily.unsupported_reasons checks, so 32 planes are 128-byte multiples).
__device__ __forceinline__ int nchw_head(StripParams const &p, int row, int q0, int odd) {
  return int((8u - (unsigned(odd) * unsigned(p.P) * unsigned(p.Q) + unsigned(row) * unsigned(p.Q) +
                    unsigned(q0))) &
             7u);
}

// Channel of accumulator row m (of M's 32 rows per output row; A's rows are in this order).
// NCHW: the even channels in rows 0-15 and the odd ones in rows 16-31, so a warp's lanes hold
// channels of one parity, consecutive rows of one TMA box, and their 64-bit stage writes below hit
// 32 banks (docs/design/strip.md, Layouts). NHWC: in order.
__device__ __forceinline__ int channel_of_row(int m) { return kNhwc ? m : 2 * (m % 16) + m / 16; }

template <int N> struct Wgmma;
// m64nNk8 with A from shared memory (SS) or registers (RS), B from shared memory
#define CUTLASS_CONVT_WGMMA(N)                                       \
  template <> struct Wgmma<N> {                                      \
    using SS = cute::SM90::GMMA::MMA_64x##N##x8_F32TF32TF32_SS_TN<>; \
    using RS = cute::SM90::GMMA::MMA_64x##N##x8_F32TF32TF32_RS_TN<>; \
  };
CUTLASS_CONVT_WGMMA(64)
CUTLASS_CONVT_WGMMA(96)
CUTLASS_CONVT_WGMMA(104)
CUTLASS_CONVT_WGMMA(112)
CUTLASS_CONVT_WGMMA(128)
#undef CUTLASS_CONVT_WGMMA

// d (+)= A B: A's descriptor (uint64_t) or its fragment (uint32_t[4]), B's descriptor
template <class A, std::size_t... I>
__device__ __forceinline__ void wgmma(A const &a, uint64_t db, float *d,
                                      cute::SM90::GMMA::ScaleOut scale, std::index_sequence<I...>) {
  if constexpr (std::is_same_v<A, uint64_t>)
    Wgmma<kTileN>::SS::fma(a, db, d[I]..., scale);
  else
    Wgmma<kTileN>::RS::fma(a[0], a[1], a[2], a[3], db, d[I]..., scale);
}
template <class A>
__device__ __forceinline__ void wgmma(A const &a, uint64_t db, float *d, bool accumulate) {
  wgmma(a, db, d, accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero,
        std::make_index_sequence<kAcc>{});
}

// TMA store of a 4-D box with an L2 eviction priority (cute's SM90_TMA_STORE_4D takes none).
__device__ __forceinline__ void tma_store_4d(cute::TmaDescriptor const *map, float const *box,
                                             int c0, int c1, int c2, int c3, CacheHint hint) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group.L2::cache_hint"
      " [%0, {%2, %3, %4, %5}], [%1], %6;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(smem_address(box)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(uint64_t(hint))
      : "memory");
}

__device__ __forceinline__ float round_tf32(float v) { return __uint_as_float(tf32_nearest(v)); }

// A: GMMA's K-major layout without swizzle, [c4][m][4] (core matrices of 8 m x 4 k at 128
// bytes), m = block * 32 + co; block (kPairRows - 1) + s (kR + kPairRows - 1) + r holds
// w[:, :, r, s] for r < kR, zeros otherwise (so a wgmma's 64 rows are blocks b and b + 1).
// Staged by kStagers threads (t of them), each with up to 64 loads in flight before it stores,
// so that the staging is short and overlaps the producer's first loads.
template <int kStagers>
__device__ __forceinline__ void stage_filter(float const *__restrict__ w, float *a, int t) {
  constexpr int kPer = (kAFloats + kStagers - 1) / kStagers, kBatch = kPer < 64 ? kPer : 64;
#pragma unroll 1
  for (int j0 = 0; j0 < kPer; j0 += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      int const i = t + kStagers * (j0 + j);
      int const k = i % 4, m = i / 4 % (kBlocks * kCO), c4 = i / (4 * kBlocks * kCO);
      int const rel = m / kCO - (kPairRows - 1), co = channel_of_row(m % kCO), ci = 4 * c4 + k;
      int const s = rel >= 0 ? rel / (kR + kPairRows - 1) : 0;
      int const r = rel >= 0 ? rel % (kR + kPairRows - 1) : kR;
      v[j] = i < kAFloats && r < kR ? w[(ci * kCO + co) * (kR * kS) + r * kS + s] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      int const i = t + kStagers * (j0 + j);
      if (i < kAFloats) a[i] = round_tf32(v[j]);
    }
  }
  fence_async_shared();
}

// A row's 16-byte chunks among the preparing threads: thread t takes chunks t + kPrepThreads k
// for k < kPrepChunks; `prep_owns(k, i)` says whether its k-th chunk, i, is in the row (only the
// last k can fall beyond it).
constexpr int kRowChunks = kRowElems / 4;
constexpr int kPrepChunks = (kRowChunks + kPrepThreads - 1) / kPrepThreads;
__device__ __forceinline__ bool prep_owns(int k, int i) {
  return (k + 1) * kPrepThreads <= kRowChunks || i < kRowChunks;
}

// The preparing threads (t of kPrepThreads): an NCHW row landed as [channel][pixel] from
// `shift` (0-7) columns left of its first, into [pixel][channel] with the 128-byte swizzle
// (16-byte chunk c of pixel j at c ^ j % 8), rounded to TF32, in place: every thread loads its
// chunks (a warp's loads cover consecutive pixels of a channel), the preparing threads sync,
// then each stores its chunks (8 consecutive pixels of a chunk column hit 8 different 16-byte
// bank groups). The last `shift` pixels, which no wgmma reads, repeat the row's last landed
// column (no branch, so the loads of all chunks are in flight together).
__device__ __forceinline__ void transpose_row(float *row, int shift, int t) {
  float4 v[kPrepChunks];
#pragma unroll
  for (int k = 0; k < kPrepChunks; ++k) {
    int const i = t + kPrepThreads * k, c4 = i / kPix, j = min(i % kPix + shift, kPix - 1);
    if (prep_owns(k, i)) {
      float const *src = row + 4 * c4 * kPix + j;
      v[k] = make_float4(round_tf32(src[0]), round_tf32(src[kPix]), round_tf32(src[2 * kPix]),
                         round_tf32(src[3 * kPix]));
    }
  }
  asm volatile("bar.sync 3, %0;\n" ::"n"(kPrepThreads) : "memory");
#pragma unroll
  for (int k = 0; k < kPrepChunks; ++k) {
    int const i = t + kPrepThreads * k, c4 = i / kPix, j = i % kPix;
    if (prep_owns(k, i)) reinterpret_cast<float4 *>(row)[j * 8 + (c4 ^ (j % 8))] = v[k];
  }
}

// The preparing threads (t of kPrepThreads): an NHWC row, landed in GMMA's swizzled layout,
// rounded to TF32 in place, 16 bytes per access. Each thread loads all its chunks before it
// stores any, so that all its loads are in flight at once (a load-store loop, whose trip count
// ptxas cannot prove, keeps only two in flight).
__device__ __forceinline__ void round_row(float *row, int t) {
  float4 *chunks = reinterpret_cast<float4 *>(row);
  float4 v[kPrepChunks];
#pragma unroll
  for (int k = 0; k < kPrepChunks; ++k) {
    int const i = t + kPrepThreads * k;
    if (prep_owns(k, i)) v[k] = chunks[i];
  }
#pragma unroll
  for (int k = 0; k < kPrepChunks; ++k) {
    int const i = t + kPrepThreads * k;
    if (prep_owns(k, i))
      chunks[i] = make_float4(round_tf32(v[k].x), round_tf32(v[k].y), round_tf32(v[k].z),
                              round_tf32(v[k].w));
  }
}

// Warpgroup 0 and the extra preparing warpgroup. Rows of a run: input rows
// 2 k0 + pad_h - (kR - 1) ... for 2 pairs + kR - 1 rows; the g-th row of the CTA goes to ring
// slot g % kRing.
__device__ void produce(StripParams const &p, cute::TmaDescriptor const *tmap_x, float *ring,
                        uint64_t *landed, uint64_t *full, uint64_t *empty) {
  int const thread = threadIdx.x;
  // index of a preparing thread (warps 1-3 first), negative for warp 0
  int const prep =
      kPrepGroups > 0 && thread >= kExtraPrep ? thread - kExtraPrep + 96 : thread - 32;
  uint32_t g = 0;
  for_each_run<false>(p, [&](int strip, int n, int k0, int pairs) {
    int const rows = kPairRows * pairs + kR - 1, h0 = kPairRows * k0 + p.pad_h - (kR - 1);
    int const w0 = strip_q0(p, strip) + p.pad_w - (kS - 1);
    // the rows' TMA box from column x0: NCHW from w0's 32-byte sector (whole-sector reads)
    // where the row's spare columns (kPix - (kTileN + kS - 1)) hold the shift, else from its
    // 16 bytes (TMA's minimum)
    int const x0 = kNhwc ? w0 : (w0 & 7) <= kPix - (kTileN + kS - 1) ? w0 & ~7 : w0 & ~3;
    for (int j = 0; j < rows; ++j, ++g) {
      int const slot = g % kRing;
      float *row = ring + slot * kRowElems;
      if (thread == 0) {  // the TMA issuer
        load_row<kRing>(tmap_x, row, landed, empty, g, kLoadHint, x0, h0 + j, n);
      } else if (prep >= 0) {  // the preparing threads round (and transpose) the row in place
        barrier_wait(&landed[slot], (g / kRing) % 2);
        if constexpr (kNhwc) {
          round_row(row, prep);
        } else {
          transpose_row(row, w0 - x0, prep);
        }
        fence_async_shared();
        barrier_arrive(&full[slot]);
      }
    }
  });
}

// Waits for the wgmma commit groups in the order they were committed (of sizeof...(I)), calling
// done(i) as group i completes.
template <class F, int... I>
__device__ __forceinline__ void wait_each_group(F &&done, std::integer_sequence<int, I...>) {
  ((cute::warpgroup_wait<int(sizeof...(I)) - 1 - I>(), done(I)), ...);
}

// Consumer warpgroup `consumer`: pairs kk = consumer, consumer + 2, ... of the CTA's sequence.
// Accumulator e of a thread: row m = 16 warp + lane / 4 + 8 (e / 2 % 2) of M (output row
// m / 32 of the pair, channel m % 32), column 8 (e / 4) + 2 (lane % 4) + e % 2.
__device__ void consume(StripParams const &p, cute::TmaDescriptor const *tmap_y,
                        float const *a, float *ring, float *stage, uint64_t *full,
                        uint64_t *empty, int consumer) {
  int const thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32;
  uint64_t const desc_a = gmma_descriptor(a, kBlocks * kCO * 16, 128, 0);
  uint64_t const desc_b = gmma_descriptor(ring, 16, 1024, 1);
  // the thread's two channels (accumulator rows m0 and m0 + 8) and output row of the pair
  int const m0 = (16 * warp + lane / 4) % kCO, prow = 16 * warp / kCO;
  int const co0 = channel_of_row(m0), co1 = channel_of_row(m0 + 8);
  float const bias0 = p.bias ? p.bias[co0] : 0.f, bias1 = p.bias ? p.bias[co1] : 0.f;
  int const barrier = 1 + consumer;  // named barrier of this warpgroup
  uint32_t g = 0, done = 0;          // ring rows and pairs of the CTA before this run
  float acc[kAcc];
  // The A fragments of the pair's first kRegisterA steps (step (i kS + s) kCI / 8 + c8 below),
  // loaded once: element (row r, k) of the step's A is a[filter_row(c4, m) 4 + k % 4] with
  // c4 = 2 c8 + k / 4, m = filter_block(i, s) kCO + r; a thread holds rows r = 16 warp +
  // lane / 4 (+ 8) and k = lane % 4 (+ 4), in that order (PTX's register fragment of A, TF32).
  uint32_t a_frag[kRegisterA > 0 ? kRegisterA : 1][4];
#pragma unroll
  for (int step = 0; step < kRegisterA; ++step) {
    int const i = step / (kS * (kCI / 8)), s = step / (kCI / 8) % kS, c8 = step % (kCI / 8);
    int const m = filter_block(i, s) * kCO + 16 * warp + lane / 4;
#pragma unroll
    for (int f = 0; f < 4; ++f)
      a_frag[step][f] =
          __float_as_uint(a[filter_row(2 * c8 + f / 2, m + 8 * (f % 2)) * 4 + lane % 4]);
  }
  for_each_run<false>(p, [&](int strip, int n, int k0, int pairs) {
    for (int kk = (consumer + kConsumers - done % kConsumers) % kConsumers; kk < pairs;
         kk += kConsumers) {
      uint32_t const g0 = g + kPairRows * kk;  // the CTA's row index of input row 0 of the pair
      // The pair's last input row, the newest, is waited for only after the wgmmas of the
      // others are issued, so that its landing overlaps them; its other new row (2) is waited
      // for up front, since a wait after some wgmmas are issued stalls them
      // (docs/design/strip.md, Forms).
#pragma unroll
      for (int i = 0; i < kR; ++i) barrier_wait(&full[(g0 + i) % kRing], (g0 + i) / kRing % 2);
#pragma unroll
      for (int e = 0; e < kAcc; ++e) cute::warpgroup_fence_operand(acc[e]);
      cute::warpgroup_arrive();
#pragma unroll
      for (int i = 0; i <= kR; ++i) {  // input row i of the pair
        if (i == kR) {
          barrier_wait(&full[(g0 + i) % kRing], (g0 + i) / kRing % 2);
          cute::warpgroup_arrive();
        }
        uint64_t const row = desc_b + ((g0 + i) % kRing * (kRowElems * 4) >> 4);
#pragma unroll
        for (int s = 0; s < kS; ++s) {
#pragma unroll
          for (int c8 = 0; c8 < kCI / 8; ++c8) {
            uint64_t const db = row + (((kS - 1 - s) * 128 + c8 * 32) >> 4);
            int const step = (i * kS + s) * (kCI / 8) + c8;
            bool const accumulate = step > 0;
            if (step < kRegisterA) {  // (the index clamped: the other branch compiles too)
              wgmma(a_frag[step < kRegisterA ? step : 0], db, acc, accumulate);
            } else {
              int const row0 = filter_row(2 * c8, filter_block(i, s) * kCO);
              wgmma(desc_a + (row0 * 16 >> 4), db, acc, accumulate);
            }
          }
        }
        cute::warpgroup_commit_batch();  // a commit group per input row
      }
      // Each row's ring slot is released as soon as its group is done, so that the producer's
      // next loads start up to 36 wgmmas earlier. Rows at the ends of a run serve one pair:
      // arrive twice.
      wait_each_group(
          [&](int i) {
            bool const edge = (i < 2 && kk == 0) || (i >= 2 && kk == pairs - 1);
            barrier_arrive(&empty[(g0 + i) % kRing]);
            if (edge) barrier_arrive(&empty[(g0 + i) % kRing]);
          },
          std::make_integer_sequence<int, kR + 1>{});
#pragma unroll
      for (int e = 0; e < kAcc; ++e) cute::warpgroup_fence_operand(acc[e]);
      // Output rows through shared memory, a pair at once (kStageRows = 2) or each of its rows in
      // turn (1: half the shared memory), and out with TMA stores.
#pragma unroll
      for (int part = 0; part < kPairRows / kStageRows; ++part) {
        int const p0 = kPairRows * (k0 + kk) + kStageRows * part, q0 = strip_q0(p, strip);
        if (thread == 0) cute::tma_store_wait<0>();  // the last stores have read the stage
        asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");
        if (kStageRows == kPairRows || prow == part) {
          int const row = kStageRows == kPairRows ? prow : 0, pp = p0 + row;
          // NCHW: the columns [lo, cols) outside the body of the thread's channels (both of
          // its parity) go to y from the registers: the head in the row's first strip, the
          // columns after the body in its last (the others are in the bodies of the
          // neighbouring strips, kStripStep apart)
          int const head = nchw_head(p, pp, q0, co0 & 1), lo = q0 == 0 ? 0 : head,
                    cols = q0 + kTileN >= p.Q ? min(kTileN, p.Q - q0) : head + p.body;
          float *const line0 = p.y + nchw_offset(p, n, co0, pp, q0);  // NCHW y rows of the
          float *const line1 = line0 + (co1 - co0) * (long long)p.P * p.Q;  // thread's channels
          // Value e of column block j and channel block half; NCHW: the row of its channel in
          // the bodies (the even channels' box, then the odd ones', rows of kBodyMax, or
          // p.body, columns), and `check` whether its column is in the body, at an end, or
          // beyond Q.
          auto value = [&](int j, int half, int e) {
            return acc[4 * j + 2 * half + e] + (half ? bias1 : bias0);
          };
          auto box_row = [&](int half) {
            int const co = half ? co1 : co0;
            return (co & 1) * (kCO / 2) + co / 2;
          };
          auto put = [&](int j, int half, int e, bool check) {
            int const co = half ? co1 : co0, col = 8 * j + 2 * (lane % 4) + e;
            float const v = value(j, half, e);
            if constexpr (kNhwc) {  // [row][column][channel], 16-byte chunks swizzled by
                                    // column % 8 (TMA's 128-byte swizzle; conflict-free)
              stage[(row * kTileN + col) * kCO + ((co / 4) ^ (col % 8)) * 4 + co % 4] = v;
            } else if (!check) {  // the body [row][box row][column - head], kBodyMax wide
              stage[(row * kCO + box_row(half)) * kBodyMax + col - head] = v;
            } else if (col >= head && col < head + p.body) {  // (a narrower body, Q < kTileN:
              // its pitch may give these writes 4- to 8-way bank conflicts, on one strip only)
              stage[row * kCO * kBodyMax + box_row(half) * p.body + col - head] = v;
            } else if (col >= lo && col < cols) {  // the row's ends to y
              (half ? line1 : line0)[col] = v;
            }
          };
          auto each = [&](auto &&f) {
#pragma unroll
            for (int j = 0; j < kTileN / 8; ++j)
#pragma unroll
              for (int half = 0; half < 2; ++half)
#pragma unroll
                for (int e = 0; e < 2; ++e) f(j, half, e);
          };
          if constexpr (kNhwc) {
            each([&](int j, int half, int e) { put(j, half, e, false); });
          } else if (pp < p.P && p.body == kBodyMax) {
            // Every strip kTileN wide: columns 8 to kBodyMax - 1 are in the body for any head
            // (0-7), so only the first column block and those from kBodyMax - 7 are checked;
            // the others are stored without a branch per value.
            auto checked = [](int j) { return j == 0 || 8 * j + 7 >= kBodyMax; };
            if (head % 2 == 0) {  // (all rows when Q is even) a value pair per 64-bit write,
              // the checked blocks' too: an even head splits no pair at the body's or the row's
              // ends (32-bit writes there would meet 2-way bank conflicts)
              each([&](int j, int half, int e) {
                int const col = 8 * j + 2 * (lane % 4);
                if (e == 1) return;
                if (!checked(j) || (col >= head && col < head + kBodyMax)) {
                  *reinterpret_cast<float2 *>(
                      &stage[(row * kCO + box_row(half)) * kBodyMax + col - head]) =
                      make_float2(value(j, half, 0), value(j, half, 1));
                } else {  // the pair outside the body: the row's ends to y
                  put(j, half, 0, true);
                  put(j, half, 1, true);
                }
              });
            } else {
              each([&](int j, int half, int e) { put(j, half, e, checked(j)); });
            }
          } else if (pp < p.P) {
            each([&](int j, int half, int e) { put(j, half, e, true); });
          }
        }
        fence_async_shared();
        asm volatile("bar.sync %0, 128;\n" ::"r"(barrier) : "memory");
        if (thread == 0) {
          if constexpr (kNhwc) {
            cute::SM90_TMA_STORE_4D::copy(tmap_y, stage, 0, q0, p0, n);
          } else {
#pragma unroll
            for (int row = 0; row < kStageRows; ++row) {
              int const pp = p0 + row;
              if (pp < p.P && p.body > 0) {
#pragma unroll
                for (int odd = 0; odd < 2; ++odd)
                  tma_store_4d(tmap_y, stage + row * kCO * kBodyMax + odd * (kCO / 2) * p.body,
                               pp * p.Q + q0 + nchw_head(p, pp, q0, odd), 0, odd, n,
                               kNchwStoreHint);
              }
            }
          }
          cute::tma_store_arrive();
        }
      }
    }
    g += kPairRows * pairs + kR - 1;
    done += pairs;
  });
  if (thread == 0) cute::tma_store_wait<0>();
}

}  // namespace

// NHWC: tmap_x is x as (C = 32, W, H, N), box (32, kPix, 1, 1); tmap_y is y as (32, Q, P, N), box
// (32, kTileN, kStageRows, 1); both fp32 with the 128-byte swizzle, zero fill out of bounds.
// NCHW: tmap_x is x as (W, H, C = 32, N), box (kPix, 1, 32, 1), no swizzle, zero fill; tmap_y is
// y as (P x Q, C / 2 = 16 channel pairs, 2 parities, N), box (p.body, 16, 1, 1), no swizzle (when
// p.body = 0, any map).
extern "C" __global__ void __launch_bounds__(kThreads, 1)
cutlass_convt_strip_kernel(StripParams const p, __grid_constant__ cute::TmaDescriptor const tmap_x,
                           __grid_constant__ cute::TmaDescriptor const tmap_y) {
  extern __shared__ __align__(1024) float smem[];
  if (smem_address(smem) % 1024 != 0) __trap();  // the 128-byte swizzle's rows need it
  float *a = smem;
  float *ring = a + kAFloats;                   // kRing rows
  float *stages = ring + kRing * kRowElems;    // kConsumers stages
  uint64_t *landed = reinterpret_cast<uint64_t *>(stages + kConsumers * kStageFloats);
  uint64_t *full = landed + kRing, *empty = full + kRing;
  if (threadIdx.x < kRing) {
    barrier_init(&landed[threadIdx.x], 1);
    barrier_init(&full[threadIdx.x], kPrepThreads);
    barrier_init(&empty[threadIdx.x], 2 * 128);  // each row serves two pairs
    fence_async_shared();  // the initialised barriers, before TMA completes transactions on them
  }
  __syncthreads();
  int const warpgroup = threadIdx.x / 128;
  if (warpgroup == 0 || (kPrepGroups > 0 && warpgroup > kConsumers)) {
    if constexpr (kReconfigure) cutlass::arch::warpgroup_reg_dealloc<kPrepRegs>();
    produce(p, &tmap_x, ring, landed, full, empty);
  } else {
    if constexpr (kReconfigure) cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
    // The consumers stage the filter while the producer's first rows are on their way.
    stage_filter<128 * kConsumers>(p.w, a, threadIdx.x - 128);
    asm volatile("bar.sync 4, %0;\n" ::"n"(128 * kConsumers) : "memory");
    consume(p, &tmap_y, a, ring, stages + (warpgroup - 1) * kStageFloats, full, empty,
            warpgroup - 1);
  }
}

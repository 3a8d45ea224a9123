// PagedLab's CPU paged-decode operator (built and loaded by backend/kernels/native):
// one new token per sequence attends to its K/V read through the block table, with
// no gather into a contiguous copy.
//
//   pagedlab::paged_decode(query [n, H, D], k_cache [num_blocks, block_size, kvh, D],
//                          v_cache (same), block_tables [n, W] int32, seq_lens [n] int32,
//                          scale, out [n, H, D]) -> ()
//
// A work item is one sequence, or one (sequence, KV head) when there are fewer
// sequences than threads. Within it, a block's rows of one KV head are loaded once and
// used from L1 by all G = H / kvh query heads of its group. The softmax is exact and
// two-pass: all scores first (heads x seq_len floats, per-thread scratch), then each
// head's max and sum, then P @ V. Arithmetic is in float32 whatever the cache's dtype.
// Every length and used block id is checked before it addresses memory: a bad one
// raises, it never reads outside the caches. Positions past a sequence's length (the
// tail of its last block, table padding) are never read.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

// exp(x) for x <= 0 (scores minus their max), branch-free so that the softmax loop
// vectorizes: Cephes' expf reduction and polynomial, within 1e-7 relative of exp on
// [-87, 0]; below -87 it returns exp(-87) ~ 1.6e-38 where exp would underflow further,
// a weight that vanishes beside the max's weight of 1.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  return p * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
}

// One block's tn rows (`stride` apart, each contiguous in D) against one query head.
// With D a compile-time constant (kD > 0) the head's query, or its accumulator, lives
// in registers for the whole block instead of being reloaded per row.
template <typename T, int64_t kD>
inline void block_scores(const float* __restrict q, const T* __restrict rows, int64_t stride,
                         int64_t tn, int64_t d, float* __restrict out) {
  if constexpr (kD > 0) {
    float qr[kD];
    for (int64_t i = 0; i < kD; ++i) qr[i] = q[i];
    for (int64_t t = 0; t < tn; ++t) {
      const T* k = rows + t * stride;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < kD; ++i) acc += qr[i] * static_cast<float>(k[i]);
      out[t] = acc;
    }
  } else {
    for (int64_t t = 0; t < tn; ++t) {
      const T* k = rows + t * stride;
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < d; ++i) acc += q[i] * static_cast<float>(k[i]);
      out[t] = acc;
    }
  }
}

// acc += sum over the block's tn rows of p[t] * row t (rows as in block_scores).
template <typename T, int64_t kD>
inline void block_weighted_sum(float* __restrict acc, const float* __restrict p,
                               const T* __restrict rows, int64_t stride, int64_t tn,
                               int64_t d) {
  if constexpr (kD > 0) {
    float a[kD];
    for (int64_t i = 0; i < kD; ++i) a[i] = acc[i];
    for (int64_t t = 0; t < tn; ++t) {
      const T* v = rows + t * stride;
      const float w = p[t];
#pragma omp simd
      for (int64_t i = 0; i < kD; ++i) a[i] += w * static_cast<float>(v[i]);
    }
    for (int64_t i = 0; i < kD; ++i) acc[i] = a[i];
  } else {
    for (int64_t t = 0; t < tn; ++t) {
      const T* v = rows + t * stride;
      const float w = p[t];
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) acc[i] += w * static_cast<float>(v[i]);
    }
  }
}

struct Shape {
  int64_t n, heads, d, num_blocks, block_size, kv_heads, group, width, table_row;
  int64_t q_seq, q_head;            // query strides (D stride 1)
  int64_t o_seq, o_head;            // out strides (D stride 1)
  int64_t c_block, c_slot, c_head;  // cache strides (D stride 1), shared by K and V
  int64_t head_chunks;              // work items per sequence (KV heads split this many ways)
};

// Each block is read right after the one before it, at an address only the table
// knows: fetching a later block's lines while this one is computed hides the miss
// that the hardware prefetcher, which follows strides, cannot. Four blocks ahead:
// small blocks (the tiny model's 512 bytes) take less time to compute than a miss
// takes to serve; measured 13-22% faster than one block ahead there, no slower for
// 12-64 KiB blocks (docs/BENCHMARKS.md).
constexpr int64_t kAhead = 4;
template <typename T>
inline void prefetch_block(const T* p, int64_t bytes) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
}

// Calls f(rows, h, p0, tn) for each of a sequence's blocks in order and each query head
// h (counted from the item's first) of KV heads [g0, g1): `rows` is the block's first
// row of h's KV head in `cache`, p0 the block's first position, tn its positions used.
// Prefetches kAhead blocks ahead, the first few before the loop.
template <typename T, typename F>
inline void for_each_block(const Shape& s, const T* cache, const int32_t* row, int64_t blocks,
                           int64_t len, int64_t g0, int64_t g1, int64_t span, F&& f) {
  for (int64_t j = 1; j < std::min(kAhead, blocks); ++j)
    prefetch_block(cache + row[j] * s.c_block + g0 * s.c_head, span);
  for (int64_t j = 0; j < blocks; ++j) {
    if (j + kAhead < blocks)
      prefetch_block(cache + row[j + kAhead] * s.c_block + g0 * s.c_head, span);
    const int64_t p0 = j * s.block_size, tn = std::min(s.block_size, len - p0);
    for (int64_t g = g0; g < g1; ++g) {
      const T* rows = cache + row[j] * s.c_block + g * s.c_head;
      const int64_t hg = (g - g0) * s.group;
      for (int64_t h = hg; h < hg + s.group; ++h) f(rows, h, p0, tn);
    }
  }
}

// Per-thread scratch: reused across a thread's items, sized by the longest.
struct Scratch {
  std::vector<float> scores, q, acc, inv;
};

// Work item `item`: sequence b = item / head_chunks and its KV heads [g0, g1). Returns
// false, writing nothing, when b's length or one of its block ids is out of range.
template <typename T, int64_t kD>
bool decode_item(const Shape& s, int64_t item, const T* q, const T* kc, const T* vc,
                 const int32_t* tables, const int32_t* lens, float scale, T* out,
                 Scratch& w) {
  const int64_t b = item / s.head_chunks, chunk = item % s.head_chunks;
  const int64_t per_chunk = s.kv_heads / s.head_chunks;
  const int64_t g0 = chunk * per_chunk, g1 = g0 + per_chunk;
  const int64_t len = lens[b];
  if (len < 1 || len > s.width * s.block_size) return false;
  const int64_t blocks = (len + s.block_size - 1) / s.block_size;
  const int32_t* row = tables + b * s.table_row;
  for (int64_t j = 0; j < blocks; ++j)
    if (row[j] < 0 || row[j] >= s.num_blocks) return false;

  const int64_t D = kD > 0 ? kD : s.d;
  const int64_t heads = (g1 - g0) * s.group;  // query heads of this item, h0 first
  const int64_t h0 = g0 * s.group;
  w.q.resize(heads * D);
  w.acc.assign(heads * D, 0.f);
  w.scores.resize(heads * len);
  w.inv.resize(heads);
  for (int64_t h = 0; h < heads; ++h) {
    const T* qh = q + b * s.q_seq + (h0 + h) * s.q_head;
    for (int64_t i = 0; i < D; ++i) w.q[h * D + i] = static_cast<float>(qh[i]) * scale;
  }
  // What one block of these heads spans in the cache, for the prefetch.
  const int64_t span = ((s.block_size - 1) * s.c_slot + (g1 - g0) * s.c_head) *
                       static_cast<int64_t>(sizeof(T));
  float* scores = w.scores.data();
  // Pass 1: every score. A block's rows of one KV head are read from memory once and
  // stay in L1 for its group's G query heads.
  for_each_block(s, kc, row, blocks, len, g0, g1, span,
                 [&](const T* rows, int64_t h, int64_t p0, int64_t tn) {
                   block_scores<T, kD>(&w.q[h * D], rows, s.c_slot, tn, D,
                                       scores + h * len + p0);
                 });
  // The softmax per head: the scores become unnormalized weights exp(s - max).
  for (int64_t h = 0; h < heads; ++h) {
    float* sh = scores + h * len;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < len; ++p) m = std::max(m, sh[p]);
    for (int64_t p = 0; p < len; ++p) sh[p] = exp_nonpositive(sh[p] - m);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t p = 0; p < len; ++p) sum += sh[p];
    w.inv[h] = 1.f / sum;
  }
  // Pass 2: P @ V, a block's V rows likewise read once for the group.
  for_each_block(s, vc, row, blocks, len, g0, g1, span,
                 [&](const T* rows, int64_t h, int64_t p0, int64_t tn) {
                   block_weighted_sum<T, kD>(&w.acc[h * D], scores + h * len + p0, rows,
                                             s.c_slot, tn, D);
                 });
  for (int64_t h = 0; h < heads; ++h) {
    T* oh = out + b * s.o_seq + (h0 + h) * s.o_head;
    for (int64_t i = 0; i < D; ++i) oh[i] = static_cast<T>(w.acc[h * D + i] * w.inv[h]);
  }
  return true;
}

template <typename T, int64_t kD>
void decode(const Shape& s, const at::Tensor& query, const at::Tensor& k_cache,
            const at::Tensor& v_cache, const at::Tensor& tables, const at::Tensor& lens,
            float scale, at::Tensor& out) {
  const T* q = query.const_data_ptr<T>();
  const T* kc = k_cache.const_data_ptr<T>();
  const T* vc = v_cache.const_data_ptr<T>();
  const int32_t* tb = tables.const_data_ptr<int32_t>();
  const int32_t* ln = lens.const_data_ptr<int32_t>();
  T* o = out.mutable_data_ptr<T>();
  std::atomic<int64_t> bad{-1};
  // An item's work is about seq_len * heads * D multiply-adds twice: a grain of one
  // item already pays for a thread wherever threads help.
  at::parallel_for(0, s.n * s.head_chunks, 1, [&](int64_t begin, int64_t end) {
    Scratch w;
    for (int64_t item = begin; item < end; ++item)
      if (!decode_item<T, kD>(s, item, q, kc, vc, tb, ln, scale, o, w))
        bad.store(item / s.head_chunks);
  });
  TORCH_CHECK(bad.load() < 0, "paged_decode: sequence ", bad.load(),
              " has a length or block id out of range");
}

template <typename T>
void decode_any_d(const Shape& s, const at::Tensor& query, const at::Tensor& k_cache,
                  const at::Tensor& v_cache, const at::Tensor& tables, const at::Tensor& lens,
                  float scale, at::Tensor& out) {
  switch (s.d) {
    case 16: return decode<T, 16>(s, query, k_cache, v_cache, tables, lens, scale, out);
    case 32: return decode<T, 32>(s, query, k_cache, v_cache, tables, lens, scale, out);
    case 64: return decode<T, 64>(s, query, k_cache, v_cache, tables, lens, scale, out);
    case 128: return decode<T, 128>(s, query, k_cache, v_cache, tables, lens, scale, out);
    default: return decode<T, 0>(s, query, k_cache, v_cache, tables, lens, scale, out);
  }
}

void paged_decode(const at::Tensor& query, const at::Tensor& k_cache,
                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                  const at::Tensor& seq_lens, double scale, at::Tensor out) {
  TORCH_CHECK(query.dim() == 3 && out.sizes() == query.sizes(),
              "paged_decode: query and out must both be [n, H, D]");
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() &&
                  v_cache.strides() == k_cache.strides(),
              "paged_decode: k_cache and v_cache must be alike [blocks, block_size, kvh, D]");
  TORCH_CHECK(query.scalar_type() == k_cache.scalar_type() &&
                  v_cache.scalar_type() == k_cache.scalar_type() &&
                  out.scalar_type() == k_cache.scalar_type(),
              "paged_decode: query, caches and out must share one dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  block_tables.dim() == 2 && block_tables.stride(1) == 1 &&
                  seq_lens.dim() == 1 && seq_lens.is_contiguous(),
              "paged_decode: block_tables [n, W] (rows contiguous) and seq_lens [n] "
              "(contiguous) must be int32");
  Shape s{};
  s.n = query.size(0);
  s.heads = query.size(1);
  s.d = query.size(2);
  s.num_blocks = k_cache.size(0);
  s.block_size = k_cache.size(1);
  s.kv_heads = k_cache.size(2);
  s.width = block_tables.size(1);
  s.table_row = block_tables.stride(0);
  TORCH_CHECK(k_cache.size(3) == s.d && s.kv_heads > 0 && s.heads % s.kv_heads == 0,
              "paged_decode: head sizes differ or query heads are not a multiple of KV heads");
  TORCH_CHECK(block_tables.size(0) == s.n && seq_lens.size(0) == s.n,
              "paged_decode: one table row and one length per query row");
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1 && k_cache.stride(3) == 1,
              "paged_decode: rows must be contiguous in D");
  TORCH_CHECK(query.device().is_cpu() && k_cache.device().is_cpu() &&
                  v_cache.device().is_cpu() && out.device().is_cpu() &&
                  block_tables.device().is_cpu() && seq_lens.device().is_cpu(),
              "paged_decode: CPU tensors only");
  s.group = s.heads / s.kv_heads;
  s.q_seq = query.stride(0);
  s.q_head = query.stride(1);
  s.o_seq = out.stride(0);
  s.o_head = out.stride(1);
  s.c_block = k_cache.stride(0);
  s.c_slot = k_cache.stride(1);
  s.c_head = k_cache.stride(2);
  // Whole sequences per item while there are enough of them to keep every thread busy
  // (each block then read once, all its heads together); else each KV head on its own.
  s.head_chunks = s.n >= at::get_num_threads() ? 1 : s.kv_heads;
  if (s.n == 0) return;
  const float sc = static_cast<float>(scale);
  switch (query.scalar_type()) {
    case at::kFloat:
      return decode_any_d<float>(s, query, k_cache, v_cache, block_tables, seq_lens, sc, out);
    case at::kBFloat16:
      return decode_any_d<c10::BFloat16>(s, query, k_cache, v_cache, block_tables, seq_lens,
                                         sc, out);
    case at::kHalf:
      return decode_any_d<c10::Half>(s, query, k_cache, v_cache, block_tables, seq_lens, sc,
                                     out);
    default: TORCH_CHECK(false, "paged_decode: float32, bfloat16 or float16 only");
  }
}

}  // namespace

TORCH_LIBRARY(pagedlab, m) {
  m.def("paged_decode(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, float scale, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(pagedlab, CPU, m) { m.impl("paged_decode", &paged_decode); }

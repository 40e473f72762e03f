// RSC sampling kernels: row scoring, budgeted top-k selection, CSR slicing.
//
// Compiled at run time by CuPy (cupy.RawModule(code=..., name_expressions=[...])); the template
// instantiations are the name expressions listed in dgl_rsc/backends/cupy_backend.py, which
// tests/test_cuda_compile.py also builds with nvcc. The specification of every kernel is the
// torch reference dgl_rsc/backends/torch_ref.py; integer outputs are bit-identical to it.
//
// Half-precision inputs use the storage types rsc_half / rsc_bf16 below (16-bit payloads with
// exact conversions to float) instead of cuda_fp16.h / cuda_bf16.h: NVRTC in pip-installed
// CuPy does not always find those headers, and the kernels need nothing but the conversion.
// Kernels that only copy values are templated on the value's byte size (unsigned short,
// unsigned int, unsigned long long): a copy is the same for every dtype of that size.
//
// Index types: int (int32) and long long (int64). Sizes and offsets are long long throughout.

struct rsc_half {
  unsigned short bits;
};
struct rsc_bf16 {
  unsigned short bits;
};

__device__ __forceinline__ float rsc_to_float(float x) { return x; }
__device__ __forceinline__ float rsc_to_float(double x) { return (float)x; }
__device__ __forceinline__ float rsc_to_float(rsc_half x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
__device__ __forceinline__ float rsc_to_float(rsc_bf16 x) {
  return __uint_as_float(((unsigned int)x.bits) << 16);
}

// ------------------------------------------------------------------------------------------
// (1) Row scores: out[i] = row_norms[i] * ||dy[i, :]||_2, squares summed in fp32.
//
// `group` threads (a power of two <= 32) share a row; each loads VEC elements (16 bytes when
// VEC > 1) per step. The host picks VEC > 1 only when d % VEC == 0, ld % VEC == 0 and dy is
// 16-byte aligned. blockDim.x must be a multiple of 32; grid = ceil(m / (blockDim.x / group)).
// ------------------------------------------------------------------------------------------
template <typename T, int VEC>
__global__ void rsc_row_scores(const float* __restrict__ row_norms, const T* __restrict__ dy,
                               long long m, long long d, long long ld, int group,
                               float* __restrict__ out) {
  const int lane = threadIdx.x & (group - 1);
  const long long row = (long long)blockIdx.x * (blockDim.x / group) + threadIdx.x / group;
  float acc = 0.f;
  if (row < m) {
    const T* p = dy + row * ld;
    if (VEC > 1) {
      const uint4* q = reinterpret_cast<const uint4*>(p);
      const long long nv = d / VEC;
      for (long long v = lane; v < nv; v += group) {
        const uint4 raw = __ldg(q + v);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float x = rsc_to_float(e[j]);
          acc = fmaf(x, x, acc);
        }
      }
    } else {
      for (long long c = lane; c < d; c += group) {
        const float x = rsc_to_float(p[c]);
        acc = fmaf(x, x, acc);
      }
    }
  }
  // every lane of the warp takes part, also those whose row is past the end
  for (int off = group >> 1; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (row < m && lane == 0) out[row] = row_norms[row] * sqrtf(acc);
}

// ------------------------------------------------------------------------------------------
// (2) Budgeted selection without a sort.
//
// The order is torch's stable descending sort of the float32 key: larger key first, NaN
// before everything, -0 equal to +0, ties by lower row id. A key maps to an unsigned int that
// sorts the same way (rsc_ordered). A "weighted select" finds the first position p in that
// order whose inclusive prefix weight exceeds `budget`: four 8-bit histogram passes from the
// top bits down narrow it to one key value T, and a tie pass over the rows with key T, in row
// order, finds the row it falls on. Rows before p are "fit". With weight = row_nnz this is the
// reference's `fit`; with weight = 1 and budget = k it is the mask `rank < k`.
//
// Per-select state: a long long array of RSC_STATE_LEN entries, indices below. The histogram
// and tie kernels hand their result to the next launch through it (the last block to finish
// does the bookkeeping), so the whole selection runs without a host round trip.
// ------------------------------------------------------------------------------------------
#define RSC_ST_PREFIX 0     // resolved top bits of T
#define RSC_ST_RESOLVED 1   // how many top bits are resolved (0, 8, 16, 24, 32)
#define RSC_ST_ABOVE_CNT 2  // rows strictly before the current bucket in the order
#define RSC_ST_ABOVE_W 3    // their weight
#define RSC_ST_BUDGET 4
#define RSC_ST_ALLFIT 5  // 1: every row fits (no boundary)
#define RSC_ST_SKIP 6    // 1: result copied from another select; the kernels do nothing
#define RSC_ST_FIT 7     // result: number of rows that fit
#define RSC_ST_CUT 8     // result: rows with key T and row id < CUT fit
#define RSC_ST_USEFUL 9  // #rows with key > 0 (counted in the first pass when asked)
#define RSC_ST_FORCED 10 // #rows with key = +-inf
#define RSC_ST_DONE 11   // blocks finished in the current launch
// RSC_STATE_LEN (state entries), RSC_BUCKETS (histogram buckets) and RSC_BLOCK (threads per
// block of the selection and slicing kernels) come from the host as -D options
// (dgl_rsc/backends/cupy_backend.py COMPILE_DEFINES is their one source).
#if !defined(RSC_STATE_LEN) || !defined(RSC_BUCKETS) || !defined(RSC_BLOCK)
#error "compile with -DRSC_STATE_LEN=... -DRSC_BUCKETS=... -DRSC_BLOCK=... (see cupy_backend.py)"
#endif
#if RSC_BUCKETS != RSC_BLOCK
#error "the histogram passes use one thread per bucket: RSC_BUCKETS must equal RSC_BLOCK"
#endif

__device__ __forceinline__ unsigned int rsc_ordered(float f) {
  unsigned int b = __float_as_uint(f);
  if (f != f) return 0xffffffffu;   // NaN first, like torch's descending sort
  if (b == 0x80000000u) b = 0u;     // -0 == +0
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

template <typename W>
__device__ __forceinline__ long long rsc_weight(const W* weight, long long i) {
  return weight ? (long long)weight[i] : 1ll;
}

// Inclusive block scan (Hillis-Steele) of one long long per thread; blockDim.x == RSC_BLOCK.
__device__ __forceinline__ long long rsc_block_scan(long long v, long long* buf) {
  const int t = threadIdx.x;
  buf[t] = v;
  __syncthreads();
  for (int off = 1; off < RSC_BLOCK; off <<= 1) {
    const long long o = t >= off ? buf[t - off] : 0;
    __syncthreads();
    buf[t] += o;
    __syncthreads();
  }
  const long long r = buf[t];
  __syncthreads();
  return r;
}

// The "last block" protocol: every block calls this once after writing its partial result;
// it returns true (in every thread) only in the block that arrives last, which may then read
// all partial results. `done` counts arrivals (reset by the last block's caller); `s_flag` is
// a __shared__ int of the calling block.
__device__ __forceinline__ bool rsc_last_block(long long* done, int* s_flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    *s_flag = atomicAdd((unsigned long long*)done, 1ull) == gridDim.x - 1ull;
  __syncthreads();
  const bool last = *s_flag != 0;
  if (last) __threadfence();
  return last;
}

// Zero the workspace and set the first select's budget. One block.
__global__ void rsc_select_init(long long* ws, long long len, long long budget) {
  for (long long i = threadIdx.x; i < len; i += blockDim.x) ws[i] = 0;
  __syncthreads();
  if (threadIdx.x == 0) ws[RSC_ST_BUDGET] = budget;
}

// One 8-bit histogram pass over the rows that match the resolved prefix.
// blockDim.x == RSC_BUCKETS. hist: 2 * RSC_BUCKETS unsigned long long (counts, then weights),
// zero on entry, zero again on exit.
template <typename W>
__global__ void rsc_select_hist(const float* __restrict__ key, const W* __restrict__ weight,
                                long long m, long long* __restrict__ st,
                                unsigned long long* __restrict__ hist, int count_extra) {
  __shared__ unsigned long long s_cnt[RSC_BUCKETS];
  __shared__ unsigned long long s_w[RSC_BUCKETS];
  __shared__ long long s_buf[RSC_BUCKETS];
  __shared__ long long s_tw, s_tc;
  __shared__ int s_last;
  __shared__ int s_pick;
  if (st[RSC_ST_SKIP] || st[RSC_ST_ALLFIT]) return;  // same value in every block
  const int t = threadIdx.x;
  const int resolved = (int)st[RSC_ST_RESOLVED];
  const unsigned int prefix = (unsigned int)st[RSC_ST_PREFIX];
  const unsigned int pmask = resolved == 0 ? 0u : (0xffffffffu << (32 - resolved));
  const int shift = 24 - resolved;
  s_cnt[t] = 0;
  s_w[t] = 0;
  __syncthreads();
  unsigned long long useful = 0, forced = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + t; i < m; i += stride) {
    const float f = key[i];
    if (count_extra) {
      useful += f > 0.f;
      forced += (__float_as_uint(f) & 0x7fffffffu) == 0x7f800000u;  // +-inf
    }
    const unsigned int u = rsc_ordered(f);
    if ((u & pmask) == prefix) {
      const unsigned int b = (u >> shift) & 0xffu;
      atomicAdd(&s_cnt[b], 1ull);
      atomicAdd(&s_w[b], (unsigned long long)rsc_weight(weight, i));
    }
  }
  if (count_extra) {
    for (int off = 16; off > 0; off >>= 1) {
      useful += __shfl_xor_sync(0xffffffffu, useful, off);
      forced += __shfl_xor_sync(0xffffffffu, forced, off);
    }
    if ((t & 31) == 0) {
      if (useful) atomicAdd((unsigned long long*)&st[RSC_ST_USEFUL], useful);
      if (forced) atomicAdd((unsigned long long*)&st[RSC_ST_FORCED], forced);
    }
  }
  __syncthreads();
  if (s_cnt[t]) {
    atomicAdd(&hist[t], s_cnt[t]);
    atomicAdd(&hist[RSC_BUCKETS + t], s_w[t]);
  }
  if (!rsc_last_block(&st[RSC_ST_DONE], &s_last)) return;

  // Last block: bucket t holds the keys with digit t; higher digits come first in the order.
  const long long cnt = (long long)__ldcg(&hist[t]);
  const long long w = (long long)__ldcg(&hist[RSC_BUCKETS + t]);
  // weight and count of the buckets > t: the totals minus the inclusive scan over 0..t
  const long long incl_w = rsc_block_scan(w, s_buf);
  const long long incl_c = rsc_block_scan(cnt, s_buf);
  if (t == RSC_BUCKETS - 1) {
    s_tw = incl_w;
    s_tc = incl_c;
  }
  if (t == 0) s_pick = -1;
  __syncthreads();
  const long long above_w_b = s_tw - incl_w;
  const long long above_c_b = s_tc - incl_c;
  const long long base_w = st[RSC_ST_ABOVE_W];
  const long long budget = st[RSC_ST_BUDGET];
  // the boundary bucket: the highest non-empty bucket whose last row exceeds the budget
  if (cnt > 0 && base_w + above_w_b + w > budget) atomicMax(&s_pick, t);
  __syncthreads();
  const int pick = s_pick;
  if (pick < 0) {
    if (t == 0) {  // every row fits (possible in the first pass only)
      st[RSC_ST_ALLFIT] = 1;
      st[RSC_ST_FIT] = m;
    }
  } else if (t == pick) {
    st[RSC_ST_PREFIX] = (long long)(prefix | ((unsigned int)pick << shift));
    st[RSC_ST_RESOLVED] = resolved + 8;
    st[RSC_ST_ABOVE_CNT] += above_c_b;
    st[RSC_ST_ABOVE_W] = base_w + above_w_b;
  }
  hist[t] = 0;
  hist[RSC_BUCKETS + t] = 0;
  if (t == 0) st[RSC_ST_DONE] = 0;
}

// Tie pass: rows whose key is exactly T (all 32 bits resolved), in row order. Block b scans
// rows [b * chunk, (b + 1) * chunk); the last block finds the chunk and then the row where the
// prefix weight passes the budget. blockDim.x == RSC_BLOCK.
// part: 2 * gridDim.x long long scratch (per-block weights, then counts).
template <typename W>
__global__ void rsc_select_tie(const float* __restrict__ key, const W* __restrict__ weight,
                               long long m, long long chunk, long long* __restrict__ st,
                               long long* __restrict__ part) {
  __shared__ long long s_buf[RSC_BLOCK];
  __shared__ long long s_first, s_pw, s_pc, s_tot_w, s_tot_c;
  __shared__ int s_last;
  if (st[RSC_ST_SKIP] || st[RSC_ST_ALLFIT]) return;
  const int t = threadIdx.x;
  const unsigned int T = (unsigned int)st[RSC_ST_PREFIX];
  const long long lo = (long long)blockIdx.x * chunk;
  const long long hi = min(m, lo + chunk);
  long long w = 0, c = 0;
  for (long long i = lo + t; i < hi; i += blockDim.x) {
    if (rsc_ordered(key[i]) == T) {
      w += rsc_weight(weight, i);
      c += 1;
    }
  }
  w = rsc_block_scan(w, s_buf);
  c = rsc_block_scan(c, s_buf);
  if (t == RSC_BLOCK - 1) {
    part[blockIdx.x] = w;
    part[gridDim.x + blockIdx.x] = c;
  }
  if (!rsc_last_block(&st[RSC_ST_DONE], &s_last)) return;

  const long long budget = st[RSC_ST_BUDGET];
  long long run_w = st[RSC_ST_ABOVE_W];
  long long run_c = st[RSC_ST_ABOVE_CNT];
  // (a) the first chunk with a tie row whose inclusive prefix weight passes the budget
  const int nb = gridDim.x;
  const int per = (nb + RSC_BLOCK - 1) / RSC_BLOCK;
  long long my_w = 0;
  for (int j = 0; j < per; ++j) {
    const int b = t * per + j;
    if (b < nb) my_w += __ldcg(&part[b]);
  }
  const long long incl_w = rsc_block_scan(my_w, s_buf);
  if (t == 0) s_first = 0x7fffffffffffffffll;
  __syncthreads();
  {
    long long cw = run_w + incl_w - my_w;
    for (int j = 0; j < per; ++j) {
      const int b = t * per + j;
      if (b < nb) {
        const long long bw = __ldcg(&part[b]);
        const long long bc = __ldcg(&part[nb + b]);
        if (bc > 0 && cw + bw > budget) {
          atomicMin((unsigned long long*)&s_first, (unsigned long long)b);
          break;
        }
        cw += bw;
      }
    }
  }
  __syncthreads();
  const long long bstar = s_first;  // exists: the tie rows' total passes the budget
  if (bstar >= nb) {  // unreachable unless the state is corrupt: keep every row, fault nothing
    if (t == 0) {
      st[RSC_ST_ALLFIT] = 1;
      st[RSC_ST_FIT] = m;
      st[RSC_ST_DONE] = 0;
    }
    return;
  }
  // weight and count of the tie rows in chunks before bstar
  long long pre_w = 0, pre_c = 0;
  for (long long b = t; b < bstar; b += blockDim.x) {
    pre_w += __ldcg(&part[b]);
    pre_c += __ldcg(&part[nb + b]);
  }
  pre_w = rsc_block_scan(pre_w, s_buf);
  pre_c = rsc_block_scan(pre_c, s_buf);
  if (t == RSC_BLOCK - 1) {
    s_pw = pre_w;
    s_pc = pre_c;
  }
  __syncthreads();
  run_w += s_pw;
  run_c += s_pc;
  // (b) scan chunk bstar in row order, RSC_BLOCK rows at a time
  const long long clo = bstar * chunk;
  const long long chi = min(m, clo + chunk);
  for (long long base = clo; base < chi; base += RSC_BLOCK) {
    const long long i = base + t;
    const bool tie = i < chi && rsc_ordered(key[i]) == T;
    const long long wi = tie ? rsc_weight(weight, i) : 0;
    const long long iw = rsc_block_scan(wi, s_buf);
    const long long ic = rsc_block_scan(tie ? 1 : 0, s_buf);
    if (t == 0) s_first = 0x7fffffffffffffffll;
    __syncthreads();
    if (tie && run_w + iw > budget) atomicMin((unsigned long long*)&s_first, (unsigned long long)i);
    __syncthreads();
    const long long first = s_first;
    if (first != 0x7fffffffffffffffll) {
      if (i == first) {
        st[RSC_ST_CUT] = first;
        st[RSC_ST_FIT] = run_c + ic - 1;  // the tie rows before `first`
      }
      break;  // uniform: every thread read the same `first`
    }
    if (t == RSC_BLOCK - 1) {
      s_tot_w = iw;
      s_tot_c = ic;
    }
    __syncthreads();
    run_w += s_tot_w;
    run_c += s_tot_c;
    __syncthreads();
  }
  if (t == 0) st[RSC_ST_DONE] = 0;
}

// k = max(min(max(fit, min(useful, min_k)), useful), forced), as in the reference; prepares
// the second select (weight 1, budget k) or, when k == fit, copies the first one's result.
__global__ void rsc_select_k(long long* __restrict__ st1, long long* __restrict__ st2,
                             long long min_k, long long* __restrict__ k_out) {
  const long long fit = st1[RSC_ST_FIT];
  const long long useful = st1[RSC_ST_USEFUL];
  const long long forced = st1[RSC_ST_FORCED];
  long long k = min(max(fit, min(useful, min_k)), useful);
  k = max(k, forced);
  *k_out = k;
  for (int j = 0; j < RSC_STATE_LEN; ++j) st2[j] = 0;
  st2[RSC_ST_BUDGET] = k;
  if (k == fit) {
    st2[RSC_ST_PREFIX] = st1[RSC_ST_PREFIX];
    st2[RSC_ST_ALLFIT] = st1[RSC_ST_ALLFIT];
    st2[RSC_ST_CUT] = st1[RSC_ST_CUT];
    st2[RSC_ST_FIT] = fit;
    st2[RSC_ST_SKIP] = 1;
  }
}

// mask[i] = rank(i) < fit of the select in `st`.
__global__ void rsc_select_mask(const float* __restrict__ key, long long m,
                                const long long* __restrict__ st, bool* __restrict__ mask) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m) return;
  const bool all = st[RSC_ST_ALLFIT] != 0;
  const unsigned int T = (unsigned int)st[RSC_ST_PREFIX];
  const long long cut = st[RSC_ST_CUT];
  const unsigned int u = rsc_ordered(key[i]);
  mask[i] = all || u > T || (u == T && i < cut);
}

// ------------------------------------------------------------------------------------------
// (3a) slice_transposed: drop the entries of A^T whose row id (t_rows) is not kept, unless the
// optional entry_keep mask keeps them (a self-loop diagonal applied exactly).
//
// A warp owns a chunk of 1024 entries (32 words of 32): it writes the keep bitmap, the
// exclusive popcount of each word within the chunk, and the chunk's total. After an exclusive
// scan of the chunk totals (on the host side, a device cumsum), the compaction and the new
// indptr read positions straight off the bitmap: pos(e) = chunk_excl + word_excl + popc(bits
// of the word below e).
// ------------------------------------------------------------------------------------------
template <typename I>
__global__ void rsc_keep_bitmap(const I* __restrict__ t_rows, long long nnz,
                                const bool* __restrict__ row_mask,
                                const bool* __restrict__ entry_keep,  // nullable
                                unsigned int* __restrict__ bitmap,
                                unsigned short* __restrict__ word_excl,
                                long long* __restrict__ chunk_cnt, long long nchunks) {
  const long long c = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (c >= nchunks) return;  // whole warps
  const long long base = c << 10;
  unsigned int mine = 0;
#pragma unroll 8
  for (int j = 0; j < 32; ++j) {
    const long long e = base + (j << 5) + lane;
    const bool keep =
        e < nnz && (row_mask[(long long)t_rows[e]] || (entry_keep != nullptr && entry_keep[e]));
    const unsigned int word = __ballot_sync(0xffffffffu, keep);
    if (lane == j) mine = word;
  }
  const unsigned int pc = __popc(mine);
  unsigned int incl = pc;
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned int o = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += o;
  }
  bitmap[(c << 5) + lane] = mine;
  word_excl[(c << 5) + lane] = (unsigned short)(incl - pc);
  if (lane == 31) chunk_cnt[c] = incl;
}

// Compact the kept entries (row ids, and values when given) in order. chunk_incl: inclusive
// scan of chunk_cnt. V: an unsigned type of the values' byte size.
template <typename I, typename V>
__global__ void rsc_compact(const I* __restrict__ t_rows, const V* __restrict__ t_vals,
                            const unsigned int* __restrict__ bitmap,
                            const unsigned short* __restrict__ word_excl,
                            const long long* __restrict__ chunk_incl, long long nchunks,
                            I* __restrict__ out_rows, V* __restrict__ out_vals) {
  const long long c = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (c >= nchunks) return;
  const long long start = c ? chunk_incl[c - 1] : 0;
  const unsigned int my_word = bitmap[(c << 5) + lane];
  const unsigned int my_excl = word_excl[(c << 5) + lane];
  const unsigned int below = (1u << lane) - 1u;
#pragma unroll 4
  for (int j = 0; j < 32; ++j) {
    const unsigned int word = __shfl_sync(0xffffffffu, my_word, j);
    const unsigned int wex = __shfl_sync(0xffffffffu, my_excl, j);
    if ((word >> lane) & 1u) {
      const long long e = (c << 10) + (j << 5) + lane;
      const long long pos = start + wex + __popc(word & below);
      out_rows[pos] = t_rows[e];
      if (t_vals) out_vals[pos] = t_vals[e];
    }
  }
}

// new_indptr[j] = number of kept entries before t_indptr[j].
template <typename I>
__global__ void rsc_indptr_from_bitmap(const I* __restrict__ t_indptr, long long n1,
                                       long long nnz, const unsigned int* __restrict__ bitmap,
                                       const unsigned short* __restrict__ word_excl,
                                       const long long* __restrict__ chunk_incl,
                                       long long nchunks, I* __restrict__ out) {
  const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n1) return;
  const long long p = (long long)t_indptr[j];
  long long v;
  if (p >= nnz) {
    v = nchunks ? chunk_incl[nchunks - 1] : 0;
  } else {
    const long long c = p >> 10, w = p >> 5;
    const unsigned int below = (1u << (p & 31)) - 1u;
    v = (c ? chunk_incl[c - 1] : 0) + word_excl[w] + __popc(bitmap[w] & below);
  }
  out[j] = (I)v;
}

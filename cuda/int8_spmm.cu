// INT8 training kernels (dgl_rsc/int8): the INT8 sparse-dense product with int32 accumulation
// and one fused dequantize, and the int8 codes of a tensor (round-to-nearest or stochastic
// rounding with a counter-based hash).
//
// Compiled at run time by CuPy (cupy.RawModule(code=..., options=..., name_expressions=...));
// dgl_rsc/backends/int8_cupy.py lists the instantiations and the options, and
// tests/test_cuda_compile.py builds the same set with nvcc. The specification is the torch
// reference: dgl_rsc/backends/int8_ref.py (product) and dgl_rsc/quant/rounding.py
// (torch_codes). The integer accumulation is exact (the host checks that no row can overflow
// int32), so the integers equal the reference's in any summation order; the float operations
// are single IEEE round-to-nearest operations in the reference's order, written with the _rn
// intrinsics so that nothing is contracted into an FMA.
//
// Layouts (all contiguous):
//   indptr (rows + 1), indices (nnz) of index type I; qvals (nnz) int8 or null (all ones);
//   qx (n, dim) int8; row_factor (rows) float or null; col_scale (dim) float;
//   out (rows, dim) float.
// Launch rsc_int8_spmm with blockDim = (32, rows per block), grid = ceil(rows / blockDim.y):
// a warp per row, each lane owning features lane, lane + 32, ...

// Wellons' lowbias32: the hash of dgl_rsc/quant/rounding.py (lowbias32), bit for bit.
__device__ __forceinline__ unsigned int rsc_lowbias32(unsigned int x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// u in [0, 1) of element i for a seed (hash_uniform): 24 random bits.
__device__ __forceinline__ float rsc_hash_uniform(unsigned int seed, unsigned long long i) {
  const unsigned int h = rsc_lowbias32(rsc_lowbias32((unsigned int)(i & 0xFFFFFFFFull)) ^ seed);
  return __fmul_rn((float)(h >> 8), 5.9604644775390625e-08f);  // 2^-24, exact
}

template <typename I, bool VALS>
__global__ void rsc_int8_spmm(const I* __restrict__ indptr, const I* __restrict__ indices,
                              const signed char* __restrict__ qvals,
                              const signed char* __restrict__ qx, long long rows, long long dim,
                              const float* __restrict__ row_factor,
                              const float* __restrict__ col_scale, float* __restrict__ out) {
  const long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y;
  if (r >= rows) return;
  const long long start = (long long)indptr[r], stop = (long long)indptr[r + 1];
  const float rf = row_factor != nullptr ? row_factor[r] : 1.f;
  for (long long f0 = 0; f0 < dim; f0 += 32 * 4) {
    // four features per lane, int32 accumulators
    int acc[4] = {0, 0, 0, 0};
    for (long long e = start; e < stop; ++e) {
      const long long j = (long long)indices[e];
      const int v = VALS ? (int)qvals[e] : 1;
      const signed char* xr = qx + j * dim;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const long long f = f0 + threadIdx.x + 32 * k;
        if (f < dim) acc[k] += v * (int)xr[f];
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const long long f = f0 + threadIdx.x + 32 * k;
      if (f < dim) {
        const float y = __fmul_rn(__int2float_rn(acc[k]), col_scale[f]);
        out[r * dim + f] = row_factor != nullptr ? __fmul_rn(y, rf) : y;
      }
    }
  }
}

// The int8 codes of x (rows, cols) for scales s of shape (s_rows, s_cols), each 1 or the
// matching extent (broadcast): q = clamp(round_half_even(x / s)) or clamp(floor(x / s + u)),
// NaN -> 0, a zero scale divides by 1 (dgl_rsc/quant/rounding.py: torch_codes).
template <bool STOCHASTIC>
__global__ void rsc_int8_codes(const float* __restrict__ x, long long rows, long long cols,
                               const float* __restrict__ s, long long s_rows, long long s_cols,
                               unsigned int seed, signed char* __restrict__ q) {
  const long long n = rows * cols;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / cols, c = i % cols;
    const float sv = s[(s_rows > 1 ? r : 0) * s_cols + (s_cols > 1 ? c : 0)];
    float v = __fdiv_rn(x[i], sv > 0.f ? sv : 1.f);
    if (STOCHASTIC) {
      v = floorf(__fadd_rn(v, rsc_hash_uniform(seed, (unsigned long long)i)));
    } else {
      v = rintf(v);
    }
    if (v != v) v = 0.f;
    q[i] = (signed char)fminf(fmaxf(v, -127.f), 127.f);
  }
}

// Message codec kernels: stochastic row quantization (2/4/8 bits) with packing, and stochastic
// rounding to bfloat16 (16 bits), for the halo exchange.
//
// Compiled at run time by CuPy (cupy.RawModule(code=..., options=..., name_expressions=...));
// dgl_rsc/distributed/quant_cupy.py lists the instantiations and the options, and
// tests/test_quant_cuda.py builds the same set with nvcc. The specification is the torch
// reference in dgl_rsc/distributed/quant.py: for the same random numbers u the bytes written and
// the values decoded are identical to it (every float operation below is a single IEEE
// round-to-nearest operation, written as inline PTX so that nothing is contracted or
// reassociated; the one product of a decode, q * s, is exact: q < 256 and s has 8 significant
// bits).
//
// Subnormals: CuPy compiles with -ftz=true, appended after the caller's options (so
// quant_cupy.OPTIONS cannot undo it), and under it every single-precision instruction the
// compiler emits flushes subnormal operands and results to zero, while the reference keeps
// them. Hence the qz_add/sub/mul/div/min/max below are inline PTX without .ftz (ptxas takes
// them as written), the fp64 input is converted the same way, and the comparisons of values
// that may be subnormal compare bit patterns (of non-negative values, where bit order is value
// order) or the sign bit. Seen on an H200 with CuPy 14.2 (a row of subnormals encoded as a
// constant row).
//
// Constants from the host (one source: quant.py):
//   huge           (argument)   entries with |x| > huge (and inf, NaN) make a row special;
//   BITS, RESERVED (template)   bit width and the number of top codes of a special row that
//                               mark non-finite entries (NaN, +inf, -inf in that order; with
//                               RESERVED == 1 the single code means NaN).
//
// Layouts (all contiguous): x (rows, dim) of T, u (rows, dim) float, meta (rows, 2) 16-bit
// (bf16 offset, bf16 scale | special << 15), codes (rows, row_bytes) with entry j of a row in
// byte j / (8 / BITS) at bit (j % (8 / BITS)) * BITS. Launch the row kernels with
// blockDim = (32, rows per block), grid = ceil(rows / blockDim.y): a warp per row.

struct qz_half {
  unsigned short bits;
};
struct qz_bf16 {
  unsigned short bits;
};

#define QZ_BINARY(name, op)                                          \
  __device__ __forceinline__ float name(float a, float b) {          \
    float r;                                                         \
    asm(op " %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));               \
    return r;                                                        \
  }
QZ_BINARY(qz_add, "add.rn.f32")
QZ_BINARY(qz_sub, "sub.rn.f32")
QZ_BINARY(qz_mul, "mul.rn.f32")
QZ_BINARY(qz_div, "div.rn.f32")
QZ_BINARY(qz_min, "min.f32")  // the operand that is not NaN, as fminf
QZ_BINARY(qz_max, "max.f32")
#undef QZ_BINARY

__device__ __forceinline__ float qz_to_float(float x) { return x; }
__device__ __forceinline__ float qz_to_float(double x) {
  float f;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(f) : "d"(x));
  return f;
}
__device__ __forceinline__ float qz_to_float(qz_half x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
__device__ __forceinline__ float qz_to_float(qz_bf16 x) {
  return __uint_as_float(((unsigned int)x.bits) << 16);
}

// v rounded to the bf16 grid (low 16 bits cleared), away from zero when `away` is set.
__device__ __forceinline__ float qz_bf16_grid(float v, bool away) {
  const unsigned int b = __float_as_uint(v);
  const unsigned int lo = b & 0xFFFFu;
  return __uint_as_float(b - lo + ((lo != 0u && away) ? 0x10000u : 0u));
}

template <int RESERVED>
__device__ __forceinline__ unsigned int qz_code(float v, float u, float off, float s, int lr,
                                                float huge) {
  if (fabsf(v) <= huge) {
    if (__float_as_uint(s) == 0u) return 0u;  // constant row (s >= +0): every entry is the offset
    // v - off >= 0 (off <= min), so w >= 0 and its floor is the same flushed or not
    const float w = qz_add(qz_div(qz_sub(v, off), s), u);
    return (unsigned int)fminf(fmaxf(floorf(w), 0.f), (float)lr);
  }
  const int kind = isnan(v) ? 0 : (v > 0.f ? 1 : 2);
  return (unsigned int)(lr + 1 + min(kind, RESERVED - 1));
}

// ------------------------------------------------------------------------------------------
// Quantize and pack: per row, min/max of the ordinary entries (warp reduction), the bf16
// offset (rounded down) and scale (rounded up, one more step if s * lr < max - offset), then
// every lane packs whole code bytes.
// ------------------------------------------------------------------------------------------
template <typename T, int BITS, int RESERVED>
__global__ void qz_encode(const T* __restrict__ x, const float* __restrict__ u, long long rows,
                          long long dim, long long row_bytes, float huge,
                          unsigned short* __restrict__ meta, unsigned char* __restrict__ codes) {
  constexpr int FULL = (1 << BITS) - 1;
  constexpr int PER = 8 / BITS;
  const long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y;
  if (r >= rows) return;  // a warp is one row and leaves as a whole
  const int lane = threadIdx.x;
  const T* xr = x + r * dim;
  const float* ur = u + r * dim;

  float mn = __uint_as_float(0x7F800000u), mx = -mn;
  int special = 0;
  for (long long j = lane; j < dim; j += 32) {
    const float v = qz_to_float(xr[j]);
    if (fabsf(v) <= huge) {
      mn = qz_min(mn, v);
      mx = qz_max(mx, v);
    } else {
      special = 1;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    mn = qz_min(mn, __shfl_xor_sync(0xFFFFFFFFu, mn, o));
    mx = qz_max(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
  }
  special = __any_sync(0xFFFFFFFFu, special);
  if (mn > mx) mn = mx = 0.f;  // no ordinary entry (+inf > -inf; flushing keeps a <= b)
  mn = qz_add(mn, 0.f);        // -0.0 -> +0.0, as the reference does
  mx = qz_add(mx, 0.f);

  const int lr = special ? FULL - RESERVED : FULL;
  const float lrf = (float)lr;
  const bool negative = (int)__float_as_uint(mn) < 0;  // mn < 0, subnormal too (-0.0 is gone)
  const float off = qz_bf16_grid(mn, negative);
  const float d = qz_sub(mx, off);  // >= +0
  float s = qz_bf16_grid(qz_div(d, lrf), true);
  if (__float_as_uint(qz_mul(s, lrf)) < __float_as_uint(d))  // both >= +0: s * lr < d
    s = __uint_as_float(__float_as_uint(s) + 0x10000u);
  if (lane == 0) {
    meta[2 * r] = (unsigned short)(__float_as_uint(off) >> 16);
    meta[2 * r + 1] = (unsigned short)((__float_as_uint(s) >> 16) | (special ? 0x8000u : 0u));
  }
  for (long long k = lane; k < row_bytes; k += 32) {
    unsigned int byte = 0u;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const long long j = k * PER + i;
      if (j < dim) {
        byte |= qz_code<RESERVED>(qz_to_float(xr[j]), ur[j], off, s, lr, huge) << (i * BITS);
      }
    }
    codes[r * row_bytes + k] = (unsigned char)byte;
  }
}

// ------------------------------------------------------------------------------------------
// Unpack and dequantize into float32 out (rows, dim): off + q * s, or the non-finite value a
// reserved code of a special row stands for.
// ------------------------------------------------------------------------------------------
template <int BITS, int RESERVED>
__global__ void qz_decode(const unsigned short* __restrict__ meta,
                          const unsigned char* __restrict__ codes, long long rows, long long dim,
                          long long row_bytes, float* __restrict__ out) {
  constexpr int FULL = (1 << BITS) - 1;
  constexpr int PER = 8 / BITS;
  const long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y;
  if (r >= rows) return;
  const float off = __uint_as_float(((unsigned int)meta[2 * r]) << 16);
  const unsigned int sb = meta[2 * r + 1];
  const float s = __uint_as_float((sb & 0x7FFFu) << 16);
  const int lr = (sb & 0x8000u) ? FULL - RESERVED : FULL;
  const unsigned char* cr = codes + r * row_bytes;
  for (long long j = threadIdx.x; j < dim; j += 32) {
    const int q = (cr[j / PER] >> ((j % PER) * BITS)) & FULL;
    float y;
    if (q > lr) {
      const int kind = q - lr - 1;
      y = __uint_as_float(kind == 1 ? 0x7F800000u : (kind == 2 ? 0xFF800000u : 0x7FC00000u));
    } else {
      y = qz_add(off, qz_mul((float)q, s));
    }
    out[r * dim + j] = y;
  }
}

// ------------------------------------------------------------------------------------------
// 16 bits: stochastic rounding to bf16. The magnitude's low 16 bits plus floor(u * 2^16)
// carry into the kept bits with probability low / 2^16. Finite values stay finite (clamped to
// the largest finite bf16), infinities keep their sign, NaN becomes 0x7FC0.
// ------------------------------------------------------------------------------------------
template <typename T>
__global__ void qz_encode_bf16(const T* __restrict__ x, const float* __restrict__ u, long long n,
                               unsigned short* __restrict__ out) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const unsigned int b = __float_as_uint(qz_to_float(x[i]));
    const unsigned int mag = b & 0x7FFFFFFFu;
    unsigned int hi;
    if (mag > 0x7F800000u) {
      out[i] = 0x7FC0u;
      continue;
    }
    if (mag == 0x7F800000u) {
      hi = 0x7F80u;
    } else {
      hi = min((mag + (unsigned int)(u[i] * 65536.f)) >> 16, 0x7F7Fu);
    }
    out[i] = (unsigned short)(hi | ((b >> 31) << 15));
  }
}

__global__ void qz_decode_bf16(const unsigned short* __restrict__ src, long long n,
                               float* __restrict__ out) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = __uint_as_float(((unsigned int)src[i]) << 16);
  }
}

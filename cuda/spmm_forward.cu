// The forward sparse-dense product of a GCN-style layer on CUDA, degree scaling and bias fused:
//
//   out[r, f] = rf[r] * sum_{e in row r} (v_e * cf[j_e]) * X[j_e, f] + bias[f]
//
// (rf, cf, v and bias each optional), fp32 accumulation for fp32 or bf16 X, out in X's type.
// The specification is the torch reference dgl_rsc/backends/spmm_cupy.py: reference().
//
// Work is planned once per matrix on the host (dgl_rsc/backends/spmm_cupy.py: plan()): a row of
// at most `chunk` entries is one work item, written directly; a longer row is cut into items of
// `chunk` entries whose fp32 partial sums go to a workspace, and rsc_spmm_fwd_reduce adds a
// row's partials in item order (no atomics: the same bits on every run). Items are ordered
// longest first, so the long rows start first and the short ones fill the tail.
//
// Launch rsc_spmm_fwd with blockDim = (32, warps per block), a warp per item; each lane owns
// VEC consecutive features per load (16-byte loads: 4 fp32 or 8 bf16) and NV such loads, so a
// pass covers 32 * VEC * NV features; wider rows take several passes.
// bf16 is a 16-bit storage type with its conversions written out (round to nearest even, NaN
// kept quiet), not cuda_bf16.h: NVRTC in pip-installed CuPy does not always find that header.
struct rsc_fwd_bf16 {
  unsigned short bits;
};

__device__ __forceinline__ float rsc_bf16_to_float(unsigned short b) {
  return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned int rsc_float_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

template <typename T> struct Vec;
template <> struct Vec<float> {
  static constexpr int N = 4;
  __device__ static __forceinline__ void load(const float* p, float* o) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
  }
  __device__ static __forceinline__ void store(float* p, const float* o) {
    *reinterpret_cast<float4*>(p) = make_float4(o[0], o[1], o[2], o[3]);
  }
};
template <> struct Vec<rsc_fwd_bf16> {
  static constexpr int N = 8;
  __device__ static __forceinline__ void load(const rsc_fwd_bf16* p, float* o) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      o[2 * k] = rsc_bf16_to_float((unsigned short)(w[k] & 0xffffu));
      o[2 * k + 1] = rsc_bf16_to_float((unsigned short)(w[k] >> 16));
    }
  }
  __device__ static __forceinline__ void store(rsc_fwd_bf16* p, const float* o) {
    unsigned int w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = rsc_float_to_bf16(o[2 * k]) | (rsc_float_to_bf16(o[2 * k + 1]) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

// One warp per item: item i covers entries [start[i], start[i] + len[i]) of row row[i]; slot[i]
// is -1 for a whole row (the epilogue writes out) or the workspace row of a partial sum.
template <typename I, typename T, int NV>
__global__ void rsc_spmm_fwd(const I* __restrict__ indices, const float* __restrict__ vals,
                             const T* __restrict__ X, long long dim,
                             const float* __restrict__ cf, const float* __restrict__ rf,
                             const float* __restrict__ bias, const int* __restrict__ row,
                             const long long* __restrict__ start, const int* __restrict__ len,
                             const int* __restrict__ slot, long long items,
                             T* __restrict__ out, float* __restrict__ work) {
  constexpr int VEC = Vec<T>::N;
  const long long item = (long long)blockIdx.x * blockDim.y + threadIdx.y;
  if (item >= items) return;
  const int r = row[item];
  const long long e0 = start[item], e1 = e0 + len[item];
  const int s = slot[item];
  const float scale = (s < 0 && rf != nullptr) ? rf[r] : 1.f;
  for (long long f0 = 0; f0 < dim; f0 += 32 * VEC * NV) {
    float acc[NV][VEC];
#pragma unroll
    for (int v = 0; v < NV; ++v)
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[v][k] = 0.f;
    long long e = e0;
    for (; e + 1 < e1; e += 2) {  // two rows in flight
      const long long j0 = (long long)indices[e], j1 = (long long)indices[e + 1];
      float w0 = vals != nullptr ? vals[e] : 1.f, w1 = vals != nullptr ? vals[e + 1] : 1.f;
      if (cf != nullptr) { w0 *= cf[j0]; w1 *= cf[j1]; }
      float x0[NV][VEC], x1[NV][VEC];
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        const long long f = f0 + (v * 32 + threadIdx.x) * VEC;
        if (f < dim) {
          Vec<T>::load(X + j0 * dim + f, x0[v]);
          Vec<T>::load(X + j1 * dim + f, x1[v]);
        }
      }
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[v][k] += w0 * x0[v][k] + w1 * x1[v][k];
    }
    if (e < e1) {
      const long long j0 = (long long)indices[e];
      float w0 = vals != nullptr ? vals[e] : 1.f;
      if (cf != nullptr) w0 *= cf[j0];
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        const long long f = f0 + (v * 32 + threadIdx.x) * VEC;
        if (f < dim) {
          float x0[VEC];
          Vec<T>::load(X + j0 * dim + f, x0);
#pragma unroll
          for (int k = 0; k < VEC; ++k) acc[v][k] += w0 * x0[k];
        }
      }
    }
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      const long long f = f0 + (v * 32 + threadIdx.x) * VEC;
      if (f >= dim) continue;
      if (s >= 0) {
#pragma unroll
        for (int k = 0; k < VEC; k += 4) Vec<float>::store(work + (long long)s * dim + f + k, acc[v] + k);
      } else {
        float y[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) y[k] = acc[v][k] * scale + (bias != nullptr ? bias[f + k] : 0.f);
        Vec<T>::store(out + (long long)r * dim + f, y);
      }
    }
  }
}

// One warp per long row h: out[row] = rf * sum of its partials (in item order) + bias.
template <typename T>
__global__ void rsc_spmm_fwd_reduce(const float* __restrict__ work, long long dim,
                                    const int* __restrict__ long_row,
                                    const int* __restrict__ first_slot, long long rows,
                                    const float* __restrict__ rf, const float* __restrict__ bias,
                                    T* __restrict__ out) {
  const long long h = (long long)blockIdx.x * blockDim.y + threadIdx.y;
  if (h >= rows) return;
  const int r = long_row[h];
  const int s0 = first_slot[h], s1 = first_slot[h + 1];
  const float scale = rf != nullptr ? rf[r] : 1.f;
  constexpr int VEC = Vec<T>::N;
  for (long long f = (long long)threadIdx.x * VEC; f < dim; f += 32 * VEC) {
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
    for (int s = s0; s < s1; ++s) {
      float p[VEC];
#pragma unroll
      for (int k = 0; k < VEC; k += 4) Vec<float>::load(work + (long long)s * dim + f + k, p + k);
#pragma unroll
      for (int k = 0; k < VEC; ++k) acc[k] += p[k];
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = acc[k] * scale + (bias != nullptr ? bias[f + k] : 0.f);
    Vec<T>::store(out + (long long)r * dim + f, acc);
  }
}

"""Sparse formats and exact products, framework-free: ``CSR``, the homogeneous ``Graph``, the
exact sparse-dense products (one dispatch point between CPU and CUDA engines), their Numba CPU
kernels, output buffers and the structure cache. Knows nothing of RSC."""

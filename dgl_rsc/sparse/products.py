"""Exact sparse-dense products: the one dispatch point between the CPU and CUDA engines.

``csr_mm(A, X)`` computes ``diag(rs) A diag(cs) X`` (scales optional). On the CPU it runs
DGL's own message-passing kernel (:mod:`dgl_rsc.dgl.kernels`, plugged in by :func:`register`)
or the Numba kernels of :mod:`dgl_rsc.sparse.cpu_spmm` (the same bits), whichever measured
faster for the structure and width (:mod:`.engine_pick`); products of a cached RSC slice
(``sparse_write``) always run on the Numba kernels, which write only the rows the slice
reaches. Outputs are reusable buffers of the matrix's
:class:`~dgl_rsc.sparse.buffers.OutputPool`. Without Numba or DGL, the CPU engine is torch's
sparse CSR engine (MKL). On CUDA it runs cuSPARSE through ``torch.sparse`` with the scales
applied around it. fp16/bf16 are computed in fp32 on the CPU (no engine has a CPU path).
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence

import torch

from ..backends import spmm_cupy
from ..base import _deps
from . import compact, engine_pick
from .buffers import OutputPool
from .csr import CSR
from .scales import NO_SCALES, Scales

__all__ = [
    "Scales",
    "coo_mm",
    "cpu_engine",
    "csr_mm",
    "csr_mm_sum",
    "csr_t_mm",
    "pooled_output",
    "register",
    "sddmm",
]

_CPU_UPCAST = (torch.float16, torch.bfloat16)
_NUMBA = (torch.float32, torch.float64)  # dtypes the Numba kernels take


#: The engines a higher layer plugs in, so that this layer imports none of them (the package's
#: ``__init__`` registers both): ``"exact_cpu"``, a module with ``usable(X)``,
#: ``spmm(structure, values, X, scales, out)`` and ``spmm_add(structure, values, X, out)``
#: (DGL's kernel, :mod:`dgl_rsc.dgl.kernels`); ``"quantized"``, the product
#: ``f(A, X, scales)`` of scales that carry a ``quant`` state
#: (:func:`dgl_rsc.int8.spmm.quantized_product`: INT8 or this module's fp32 product,
#: whichever measured faster).
ENGINES: dict = {"exact_cpu": None, "quantized": None}


def register(kind: str, engine) -> None:
    """Plug ``engine`` in as the ``kind`` of :data:`ENGINES` (``None`` unplugs it)."""
    if kind not in ENGINES:
        raise ValueError(f"unknown engine kind {kind!r}; choose one of {', '.join(ENGINES)}.")
    ENGINES[kind] = engine


def _exact_cpu(X: torch.Tensor):
    """The plugged-in exact CPU engine when it takes ``X``, else ``None``."""
    engine = ENGINES["exact_cpu"]
    return engine if engine is not None and engine.usable(X) else None


def _adding_cpu(X: torch.Tensor):
    """``add(structure, values, X, out)`` (``out += A X``, each term added in stored order)
    for :func:`csr_mm_sum` on the CPU: DGL's kernel where the exact engine is plugged in,
    else the Numba kernels (float32/float64), else ``None`` (``torch.sparse``)."""
    engine = _exact_cpu(X)
    if engine is not None:
        return engine.spmm_add
    if X.device.type == "cpu" and _deps.numba_available() and X.dtype in _NUMBA:
        from .cpu_spmm import spmm_add

        return spmm_add
    return None


def cpu_engine() -> str:
    """The engines of exact CPU products: ``"dgl"`` where DGL imports (each product then picks
    DGL's or Numba's kernel, :mod:`.engine_pick`), else ``"numba"``, else ``"torch.sparse"``."""
    if _deps.dgl_available() and ENGINES["exact_cpu"] is not None:
        return "dgl"
    return "numba" if _deps.numba_available() else "torch.sparse"


def _cast(t: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    return None if t is None else t.to(dtype).contiguous()


def pooled_output(pool: Optional[OutputPool], shape, X: torch.Tensor, tag=None):
    """``(out, clean, pooled)``: the ``shape`` output of a product of ``X``, a buffer of
    ``pool`` where the pool takes that shape (``clean``: see :meth:`OutputPool.take`), else a
    fresh tensor."""
    if pool is not None and OutputPool.enabled_for(shape, X.dtype, X.device):
        out, clean = pool.take(shape, X.dtype, tag)
        return out, clean, True
    return torch.empty(shape, dtype=X.dtype), False, False


def _numba_mm(indptr, indices, values, shape, X, scales: Scales, pool: Optional[OutputPool],
              tag=None):  # fmt: skip
    from .cpu_spmm import spmm_rows

    out, clean, pooled = pooled_output(pool, (shape[0], X.shape[1]), X, tag)
    row = _cast(scales.row, X.dtype)
    # a clean buffer keeps its zero rows: only rows with entries are written (unless a
    # non-finite row scale would turn an empty row into NaN, as the full write does)
    skip = clean and (row is None or bool(torch.isfinite(row).all()))
    spmm_rows(
        indptr, indices, values, X, out, row_scale=row, row_divide=scales.row_divide,
        col_scale=_cast(scales.col, X.dtype), skip_empty=skip,
    )  # fmt: skip
    if pooled and tag is not None:
        pool.mark(out, tag)
    return out


def _torch_csr(indptr, indices, values, shape) -> torch.Tensor:
    """A ``torch.sparse_csr_tensor`` of a structure dgl_rsc built or checked: saying so
    (``check_invariants=False``) keeps torch >= 2.3 from warning on every product that its
    checks are off, and torch's note that sparse CSR is in beta is not shown."""
    with warnings.catch_warnings():  # nothing for a user to act on
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(indptr, indices, values, size=shape,
                                       check_invariants=False)  # fmt: skip


def _scale_rows(out: torch.Tensor, scales: Scales, add: Optional[torch.Tensor] = None):
    """``diag(r) out + add`` in place, in one pass (``r`` divides with ``row_divide``; no
    row scale: ``out + add``); ``add`` is ``(M, 1)`` or ``None``."""
    add = None if add is None else add.to(out.dtype)
    if scales.row is None:
        return out if add is None else out.add_(add)
    r = scales.row.to(out.dtype).unsqueeze(1)
    if add is None:
        return out.div_(r) if scales.row_divide else out.mul_(r)
    return (torch.addcdiv if scales.row_divide else torch.addcmul)(add, out, r, out=out)


def _folds(nnz: int, X: torch.Tensor) -> bool:
    """Whether a column factor of a product with ``X (N, D)`` costs less folded into the
    ``nnz`` values (a gather per entry) than applied to ``X`` (a pass over ``N * D``). A
    gathered entry cost about three streamed elements on an H100 (124M entries: 1.3 ms;
    ``X`` of 2.4M x 256: 2.1 ms, x 100: 0.8 ms; ``docs/benchmarks.md``)."""
    return 3 * nnz <= X.numel()


def _folded(indices: torch.Tensor, values: torch.Tensor, col: torch.Tensor,
            dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """``(nnz,)`` ``values[e] * col[indices[e]]``, the values of ``A diag(col)``, in
    ``dtype`` (multiplied in fp32 at least)."""
    cdt = torch.float32 if dtype in _CPU_UPCAST else dtype
    return (values.to(cdt) * col.to(cdt).index_select(0, indices)).to(dtype)  # int32 or int64


def _sparse_mm(indptr, indices, values, shape, X, scales: Scales):
    if scales.col is not None and _folds(indices.numel(), X):
        values = _folded(indices, values, scales.col, X.dtype)
    elif scales.col is not None:
        X = X * scales.col.to(X.dtype).unsqueeze(1)
    out = torch.sparse.mm(_torch_csr(indptr, indices, values, shape), X)
    return _scale_rows(out, scales)


#: whether CUDA products of an operand the kernel takes run dgl_rsc's kernel
#: (``cuda/spmm_forward.cu``: 1.3-1.6x cuSPARSE in fp32, 2.1-2.3x in bf16 on an H100) rather
#: than cuSPARSE; the one switch an A/B benchmark turns
CUDA_KERNEL = True


def _cuda_kernel_mm(A: CSR, X: torch.Tensor, scales: Scales) -> Optional[torch.Tensor]:
    """The product by the CUDA kernel (scales fused), or ``None`` where it does not apply."""
    if not (CUDA_KERNEL and X.is_cuda and spmm_cupy.supported(X) and _deps.cupy_available()):
        return None
    vals = None if A.values is None else A.values.detach().float().contiguous()
    return spmm_cupy.spmm_forward(A.indptr, A.indices, vals, X, cf=_cast(scales.col, torch.float32),
                                  rf=_cast(scales.row_factor(), torch.float32),
                                  p=A._s.forward_plan())  # fmt: skip


def _mm(A: CSR, X, scales: Scales, pool, tag=None) -> torch.Tensor:
    """``(M, D)`` product of ``A (M, N)`` and ``X (N, D)``."""
    indptr, indices, shape = A.indptr, A.indices, A.shape
    out_dtype = X.dtype
    cpu = X.device.type == "cpu"
    if cpu and out_dtype in _CPU_UPCAST:
        X = X.float()
    if shape[0] == 0 or shape[1] == 0 or indices.numel() == 0 or X.shape[1] == 0:
        return X.new_zeros((shape[0], X.shape[1])).to(out_dtype)
    X = X.contiguous()
    out = None if cpu else _cuda_kernel_mm(A, X, scales)
    if out is not None:
        return out
    if cpu and _deps.numba_available() and X.dtype in _NUMBA:
        out = _numba_mm(indptr, indices, _cast(A.values, X.dtype), shape, X, scales, pool, tag)
    else:  # an unweighted matrix's ones are made once per dtype, not at every product
        vals = A.values_or_ones(X.dtype).detach().contiguous()
        out = _sparse_mm(indptr, indices, vals, shape, X, scales)
    return out.to(out_dtype)


def csr_mm(
    A: CSR,
    X: torch.Tensor,
    scales: Scales = NO_SCALES,
    pool: Optional[OutputPool] = None,
    sparse_write: bool = False,
) -> torch.Tensor:
    """``diag(r) A diag(c) X``: ``A (M, N)``, ``X (N, D)`` -> ``(M, D)`` in ``X``'s dtype.

    No autograd. On the CPU the output may share a pooled buffer of ``pool`` (default: the
    pool of ``A``'s structure); it stays valid for as long as the caller holds it. With
    ``sparse_write`` (products of a cached slice, whose many empty rows stay zero), a pooled
    buffer that the same structure's last product left unmodified is reused with only the
    rows that have entries rewritten.
    """
    if scales.quant is not None:
        if ENGINES["quantized"] is None:
            raise RuntimeError("no quantized product is registered; import dgl_rsc.int8.")
        return ENGINES["quantized"](A, X, scales)
    pool = A.pool() if pool is None else pool
    engine = None if sparse_write else _exact_cpu(X)
    if engine is not None and _nonempty(A, X):
        if not (_deps.numba_available() and X.dtype in _NUMBA):
            return _dgl_mm(engine, A, X, scales, pool)
        return engine_pick.run(A._s, X.shape[1], lambda: _dgl_mm(engine, A, X, scales, pool),
                               lambda: _mm(A, X, scales, pool), X.dtype,
                               A.values is not None)  # fmt: skip
    tag = A.token if sparse_write else None
    return _mm(A, X, scales, pool, tag)


def _nonempty(A: CSR, X: torch.Tensor) -> bool:
    return A.shape[0] > 0 and A.shape[1] > 0 and A.nnz > 0 and X.dim() == 2 and X.shape[1] > 0


def _dgl_mm(engine, A: CSR, X: torch.Tensor, scales: Scales, pool: OutputPool) -> torch.Tensor:
    X = X.detach().contiguous()
    out = pooled_output(pool, (A.shape[0], X.shape[1]), X)[0]
    vals = None if A.values is None else A.values.detach().to(X.dtype).contiguous()
    return engine.spmm(A._s, vals, X, scales, out)


def csr_mm_sum(mats: Sequence[CSR], X: torch.Tensor, scales: Scales = NO_SCALES,
               col_weight=None, row_add: Optional[torch.Tensor] = None,
               pool: Optional[OutputPool] = None) -> torch.Tensor:  # fmt: skip
    """``diag(r) (A_1 diag(c * w_1) + ... + A_k diag(c * w_k)) X + row_add``: ``A_i (M, N)``
    CSRs of one shape, ``X (N, D)``, ``row_add (M, 1)`` -> ``(M, D)`` in ``X``'s dtype.
    ``col_weight``: one ``(N,)`` weight ``w`` for every matrix, or a list of one per matrix
    (``None`` entries: no weight). No autograd, no INT8 (``scales.quant`` must be ``None``).

    ``X`` is scaled once per distinct weight (on the CPU, a matrix that reads at most half
    of ``X``'s rows gets them gathered and scaled instead: :mod:`dgl_rsc.sparse.compact`),
    each product adds into one output and the row scale and ``row_add`` are applied in one
    pass. On the CPU, DGL's kernel where DGL imports, else the Numba kernels, add into a
    buffer of ``pool`` (valid while the caller holds it, as :func:`csr_mm`'s); elsewhere
    ``torch.sparse`` (cuSPARSE on CUDA, ``addmm_``). fp16/bf16 run in fp32 on the
    CPU.
    """
    if scales.quant is not None:
        raise ValueError("csr_mm_sum takes no INT8 operands; use csr_mm per matrix.")
    out_dtype = X.dtype
    if X.device.type == "cpu" and out_dtype in _CPU_UPCAST:
        X = X.float()
    shape = mats[0].shape
    many = isinstance(col_weight, (list, tuple))
    weights = list(col_weight) if many else [col_weight] * len(mats)
    if len(weights) != len(mats):
        raise ValueError(f"csr_mm_sum got {len(weights)} weights for {len(mats)} matrices.")
    scaled = {}

    def operand(w):  # X scaled by c * w, once per distinct weight
        if id(w) not in scaled:
            scaled[id(w)] = _col_scaled(X, scales.col, w)
        return scaled[id(w)]

    def factor_operand(A, w, col):
        """``(structure, operand)``: on the CPU, the rows of ``X`` that ``A`` reads, gathered
        and scaled by ``col`` where that pays; else ``X`` scaled whole (once per weight)."""
        if X.device.type == "cpu" and compact.pays(A._s, col):
            s, cols = compact.compacted(A._s)
            return s, compact.gathered(X, cols, col)
        return A._s, operand(w)

    live = [(A, w) for A, w in zip(mats, weights) if A.nnz > 0]
    add = _adding_cpu(X)
    if live and add is not None and all(_nonempty(A, X) for A, _ in live):
        out = pooled_output(pool, (shape[0], X.shape[1]), X)[0].zero_()
        for A, w in live:
            vals = None if A.values is None else A.values.detach().to(X.dtype).contiguous()
            s, Xw = factor_operand(A, w, _col_factor(scales.col, w, X.dtype))
            add(s, vals, Xw.contiguous(), out)
        return _scale_rows(out, scales, row_add).to(out_dtype)
    out = None
    for A, w in live:  # torch.sparse: the column factor goes into the values where cheaper
        vals, Xw, s = A.values_or_ones(X.dtype).detach().contiguous(), X, A._s
        col = _col_factor(scales.col, w, X.dtype)
        if col is not None and _folds(A.nnz, X):
            vals = _folded(A.indices, vals, col, X.dtype)
        elif col is not None:
            s, Xw = factor_operand(A, w, col)
        S = _torch_csr(s.indptr, s.indices, vals, s.shape)
        out = torch.sparse.mm(S, Xw) if out is None else out.addmm_(S, Xw)
    if out is None:
        out = X.new_zeros((shape[0], X.shape[1]))
    return _scale_rows(out, scales, row_add).to(out_dtype)


def _col_factor(col: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                dtype: torch.dtype) -> Optional[torch.Tensor]:  # fmt: skip
    """``(N,)`` ``col * weight`` (either may be ``None``; both: ``None``), in fp32 at least
    for ``dtype`` operands."""
    if weight is None:
        return col
    cdt = torch.float32 if dtype in _CPU_UPCAST else dtype
    return weight.to(cdt) if col is None else col.to(cdt) * weight.to(cdt)


def _col_scaled(X: torch.Tensor, col: Optional[torch.Tensor],
                weight: Optional[torch.Tensor]) -> torch.Tensor:  # fmt: skip
    """``diag(col * weight) X`` (contiguous; ``X`` itself when both are ``None``), the
    factor's product in fp32 at least, then in ``X``'s dtype."""
    col = _col_factor(col, weight, X.dtype)
    return (X if col is None else X * col.to(X.dtype).unsqueeze(1)).contiguous()


def coo_mm(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, n_rows: int,
           X: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``(n_rows, D)``: the product of the ``(n_rows, N)`` COO matrix of entries
    ``(rows[e], cols[e], values[e])`` (``(E,)`` each, any order, duplicates summed) with
    ``X (N, D)``, in ``X``'s dtype; for a few entries, read once.

    On the CPU the entries are added in their order (no sort, no CSR built): by a Numba loop
    where Numba imports (no gathered copy of ``X``), else by a gather and ``index_add_``, with
    the same bits; elsewhere the CSR product (:func:`csr_mm`), as ``index_add_`` would add
    with atomics on CUDA."""
    if X.device.type != "cpu":
        pick = CSR.from_coo(rows, cols, values.to(X.dtype), (n_rows, X.shape[0]))
        return csr_mm(pick, X)
    out = X.new_zeros((n_rows, X.shape[1]))
    if _deps.numba_available() and X.dtype in _NUMBA:
        from .cpu_spmm import coo_rows

        return coo_rows(rows.long().contiguous(), cols.long().contiguous(),
                        values.to(X.dtype).contiguous(), X.contiguous(), out)  # fmt: skip
    return out.index_add_(0, rows.long(), X[cols.long()] * values.to(X.dtype).unsqueeze(1))


def csr_t_mm(A: CSR, Y: torch.Tensor, scales: Scales = NO_SCALES) -> torch.Tensor:
    """``(diag(r) A diag(c))^T @ Y``: ``Y (M, D)`` -> ``(N, D)``, through ``A``'s cached
    transposed structure (the same kernel, no transposed slow path)."""
    return csr_mm(A.transpose(), Y, scales.transposed())


def sddmm(
    A: CSR, dY: torch.Tensor, X: torch.Tensor, scales: Scales = NO_SCALES, chunk: int = 1 << 20
) -> torch.Tensor:
    """``(nnz,)`` ``r_i c_j <dY[i], X[j]>`` for every stored entry ``(i, j)``: the gradient of
    ``A``'s values in ``Y = diag(r) A diag(c) X``. Accumulated in fp64 for fp64 operands and in
    fp32 otherwise; processed in chunks of edges to bound memory at ``chunk * D``."""
    acc = torch.float64 if torch.float64 in (dY.dtype, X.dtype) else torch.float32
    rows = A.row_ids()
    cols = A.indices.long()
    out = torch.empty(A.nnz, dtype=acc, device=A.device)
    r = scales.row_factor()
    for start in range(0, A.nnz, chunk):
        ri = rows[start : start + chunk]
        ci = cols[start : start + chunk]
        part = (dY[ri].to(acc) * X[ci].to(acc)).sum(1)
        if r is not None:
            part = part * r.to(acc)[ri]
        if scales.col is not None:
            part = part * scales.col.to(acc)[ci]
        out[start : start + chunk] = part
    return out

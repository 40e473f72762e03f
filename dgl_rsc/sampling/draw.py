"""Drawing a row sample: score, select under the budget, slice ``A[S, :]^T``, and the sampled
product with its scale. Stateless: the caching and scheduling live in
:mod:`dgl_rsc.core.layer_state` and :mod:`dgl_rsc.core.controller`.

A refresh of a layer's sample runs, through one backend (:mod:`dgl_rsc.backends`):

1. ``row_scores``: ``s_i = ||Â[i, :]|| * ||dY[i, :]||`` with ``Â = diag(r) A diag(c)``;
2. :func:`~dgl_rsc.sampling.rules.selection_key` and ``select_rows``: the best rows by the
   rule's key while their non-zeros fit the budget;
3. ``slice_transposed``: ``A[S, :]^T`` as a CSR, cut from the cached transpose;
4. the product with the slice (:func:`sample_product`) and its scale (:func:`apply_scale`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..sparse.csr import CSR
from ..sparse.products import NO_SCALES, Scales, csr_mm, csr_t_mm
from .rules import selection_key
from .scale import estimate_ls_scale

__all__ = [
    "Sample",
    "apply_scale",
    "cut_rows",
    "draw_sample",
    "mass_scale",
    "nonfinite_rows",
    "propagate_nonfinite",
    "row_norms",
    "sample_product",
    "scaled_transpose",
]

_HALF = (torch.float16, torch.bfloat16)
# Entries of ``A`` from which the non-finite check reads ``sum(dY)`` back on a GPU instead
# of multiplying ``A^T`` by a vector: at ogbn-products scale (124M entries) the product
# cost 1.5-1.8 ms a call on an H100; waiting for the device once costs tens of microseconds
# where its kernels run for milliseconds (``docs/benchmarks.md``).
_READBACK_NNZ = 1 << 23


@dataclass
class Sample:
    """A cached row sample: ``A[S, :]^T`` as a CSR of shape ``(N, M)`` plus bookkeeping.

    The slice keeps ``A``'s values (or none); the sampled product is
    ``factor * diag(c) A[S]^T diag(r) dY`` with ``A``'s scales applied at product time.
    """

    token: Optional[int]  # structure token of the A it was cut from
    alloc_version: int  # the allocation it was drawn under (a new one redraws)
    t_slice: CSR
    k: torch.Tensor  # 0-dim, rows kept
    nnz: torch.Tensor  # 0-dim, non-zeros kept
    factor: Optional[torch.Tensor] = None  # 0-dim scale of the sampled product, or None
    mask: Optional[torch.Tensor] = None  # (M,) bool, the kept rows
    scores: Optional[torch.Tensor] = None  # (M,) the scores it was drawn from (refresh only)
    uses: int = 0  # backward products it served (it is redrawn after cache_interval)
    rest: Optional[list] = None  # CSRs (N, M) of the dropped rows' groups (remainder_groups)


def row_norms(A: CSR, scales: Scales = NO_SCALES, skip_diagonal: bool = False) -> torch.Tensor:
    """``(M,)`` float32 ``||(diag(r) A diag(c))[i, :]||_2``: the rows of the normalized matrix
    (without their diagonal entry when ``skip_diagonal``)."""
    col = scales.score_col()
    diag = A.diagonal() if skip_diagonal else None
    if col is None and diag is None:
        base = A.row_norms()
    else:
        sq = None if A.values is None else A.values.detach().float().square()
        if diag is not None:
            off = (~diag[0]).float()
            sq = off if sq is None else sq * off
        c2 = (torch.ones(A.shape[1], device=A.device) if col is None
              else col.detach().float().square().to(A.device))  # fmt: skip
        base = csr_mm(A.with_values(sq), c2.reshape(-1, 1)).squeeze(1)
        base = base.clamp(min=0).sqrt()
    r = scales.row_factor()
    return base if r is None else base * r.detach().float().abs()


def draw_sample(
    A: CSR,
    dY: torch.Tensor,
    nnz_budget: int,
    rule: str,
    min_k: int,
    backend,
    rescale: str = "none",
    scales: Scales = NO_SCALES,
    diagonal: str = "sample",
    norms: Optional[torch.Tensor] = None,
) -> Sample:
    """Score rows, select them under ``nnz_budget`` and cut ``A[S, :]^T``.

    Args:
        A: ``(M, N)`` sparse matrix (scaled by ``scales`` in the product).
        dY: ``(M, D)`` output gradient.
        nnz_budget: the most non-zeros the sampled rows may hold, in the unit the budget
            solver allocates: a diagonal applied exactly (``diagonal="exact"``) comes on top
            and is not part of it.
        rescale: ``"mass"`` sets :func:`mass_scale` as the sample's factor; ``"ls"`` and
            ``"none"`` leave it unset (the least-squares factor needs the product: see
            :func:`apply_scale`).
        diagonal: ``"exact"`` keeps every diagonal (self-loop) entry in the slice, so its
            term is computed exactly, and samples rows of the off-diagonal part under
            ``nnz_budget``; ``"sample"`` treats it like any other entry.
        norms: ``(M,)`` :func:`row_norms` of ``A`` and ``scales`` when the caller has them
            (they depend on the matrix alone), else computed here.
        min_k: the fewest rows kept; at least 1 whenever a row has a non-zero score, even
            over ``nnz_budget`` (a sample never keeps nothing while the gradient is not
            zero), except with ``diagonal="exact"``, whose diagonal term is always there.
    Returns:
        A :class:`Sample` (token and epoch unset; ``scores`` set).
    """
    diag = A.diagonal() if diagonal == "exact" else None
    row_nnz = A.row_nnz() if diag is None else A.row_nnz() - diag[1]
    budget = int(nnz_budget)
    if norms is None:
        norms = row_norms(A, scales, skip_diagonal=diag is not None)
    scores = backend.row_scores(norms, dY)
    key = selection_key(scores, row_nnz, rule)
    # at least one row (when any has a non-zero score): a budget too small for the best row
    # would otherwise keep none and return an all-zero gradient (with an exact diagonal, the
    # diagonal term is already there and min_k is taken as given)
    min_k = max(int(min_k), 1 if diag is None else 0)
    mask, k = backend.select_rows(key, row_nnz, max(budget, 0), min_k)
    t_slice = cut_rows(A, mask, backend, None if diag is None else diag[2])
    factor = mass_scale(scores, mask) if rescale == "mass" else None
    return Sample(None, -1, t_slice, k, t_slice.indptr[-1].long(), factor, mask, scores)


def cut_rows(A: CSR, mask: torch.Tensor, backend, keep: Optional[torch.Tensor] = None) -> CSR:
    """``A[S, :]^T`` as an ``(N, M)`` CSR for the rows ``S`` of ``mask (M,)`` (bool), plus the
    entries of ``A^T`` that ``keep (nnz,)`` keeps in any case (an exact diagonal), through
    ``backend``; column ids stay ``A``'s row ids, values are ``A``'s (or none)."""
    # fp16/bf16 values are sliced as float32 (exact both ways): not every backend slices them
    values = A.values if A.values is None else A.values.detach()
    half = values is not None and values.dtype in _HALF
    values = values.float() if half else values
    if keep is None and hasattr(backend, "slice_rows"):  # cut from the kept rows alone
        s_indptr, s_idx, s_vals = backend.slice_rows(A.indptr, A.indices, values, A.shape,
                                                     mask)  # fmt: skip
    else:
        t_indptr, t_rows, perm = A.transposed()
        t_vals = None if values is None else values[perm]
        s_indptr, s_idx, s_vals = backend.slice_transposed(t_indptr, t_rows, t_vals, mask, keep)
    s_vals = s_vals.to(A.values.dtype) if half else s_vals
    return CSR(s_indptr, s_idx, s_vals, (A.shape[1], A.shape[0]), check=False)


def sample_product(A: CSR, sample: Sample, dY: torch.Tensor, scales: Scales) -> torch.Tensor:
    """``(N, D)`` ``factor * diag(c) A[S]^T diag(r) dY``; the output comes from the pool of
    ``A``'s transposed structure, like the exact backward's. Rows of the output that no kept
    row reaches are zero; a step that reuses the cached slice writes only the others when it
    gets back the buffer the slice's last product left unmodified."""
    return csr_mm(
        sample.t_slice,
        dY,
        scaled_transpose(scales, sample.factor, A.shape[1], dY),
        pool=A.transpose_pool(),
        sparse_write=True,
    )


def scaled_transpose(scales: Scales, factor: Optional[torch.Tensor], n: int,
                     dY: torch.Tensor) -> Scales:  # fmt: skip
    """The scales of ``factor * (diag(r) A diag(c))^T`` (``A (M, N)``, ``n = N``) for a
    product with ``dY``: the 0-dim ``factor`` (``None``: 1) folded into the row scale."""
    ts = scales.transposed()
    row = ts.row
    if factor is not None:
        f = factor.to(dY.dtype if dY.is_floating_point() else torch.float32)
        row = f.expand(n) if row is None else row * f
    return Scales(row, ts.col, quant=ts.quant)


def apply_scale(
    A: CSR, sample: Sample, dY: torch.Tensor, scales: Scales, out: torch.Tensor, rescale: str,
    probe_rows: int, generator, diagonal: str = "sample",
) -> torch.Tensor:  # fmt: skip
    """After the first product with a fresh ``"ls"`` sample: estimate its least-squares
    factor from ``out (N, D)`` (:func:`~dgl_rsc.sampling.scale.estimate_ls_scale`), store it
    in the sample for the steps that reuse it, and scale ``out`` in place. Other modes:
    ``out`` unchanged."""
    if rescale != "ls" or sample.factor is not None:
        return out
    c = estimate_ls_scale(A, dY, scales, out, sample.scores, sample.mask, probe_rows, generator,
                          skip_diagonal=diagonal == "exact")  # fmt: skip
    sample.factor = c
    return out.mul_(c.to(out.dtype))


def nonfinite_rows(A: CSR, dY: torch.Tensor, scales: Scales) -> Optional[torch.Tensor]:
    """``(N, 1)``: NaN in the columns of ``A (M, N)`` reached by a row of ``dY`` that holds a
    NaN or Inf, 0 elsewhere; added to a sampled ``A^T dY`` it makes the output non-finite
    wherever the exact product would be, including through rows the sample left out (a cached
    sample would otherwise drop a NaN that appeared between refreshes).

    ``w_i = 0 * sum(dY[i])`` is 0 for finite rows and NaN otherwise, and the term is ``A^T w``
    (one matrix-vector product, no host synchronization). Where reading one value back costs
    less than that product (on the CPU; on a GPU for ``A`` of at least ``_READBACK_NNZ``
    entries) a finite ``sum(dY)`` (which every NaN or Inf in ``dY`` would make non-finite)
    returns ``None``: the common case costs one pass over ``dY``.
    """
    readback = dY.device.type == "cpu" or A.nnz >= _READBACK_NNZ
    if readback and bool(torch.isfinite(dY.sum())):
        return None
    w = dY.sum(dim=1, keepdim=True).mul_(0)
    return csr_t_mm(A, w, scales._replace(quant=None))


def propagate_nonfinite(
    A: CSR, dY: torch.Tensor, scales: Scales, out: torch.Tensor
) -> torch.Tensor:
    """Make ``out (N, D)`` non-finite wherever the exact ``A^T dY`` would be: ``out`` plus
    :func:`nonfinite_rows` (in place), or ``out`` as it is when that is ``None``."""
    t = nonfinite_rows(A, dY, scales)
    return out if t is None else out.add_(t.to(out.dtype))


def mass_scale(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0-dim ``sum(scores) / sum(scores[mask])`` over finite scores; 1 when the kept mass is 0.

    Stays on the device (no host synchronization). With every useful row kept it is exactly 1.
    """
    finite = torch.nan_to_num(scores.float(), nan=0.0, posinf=0.0, neginf=0.0)
    total = finite.sum()
    kept = torch.where(mask, finite, torch.zeros_like(finite)).sum()
    return torch.where(kept > 0, total / kept.clamp(min=1e-30), torch.ones_like(total))

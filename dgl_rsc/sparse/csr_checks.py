"""Argument checks of a :class:`~dgl_rsc.sparse.csr.CSR`: types, shapes and the index
arrays' invariants (one pass over them), with errors that say what to fix."""

from __future__ import annotations

import operator

import torch

__all__ = ["INDEX_DTYPES", "check_csr", "check_csr_data", "check_shape"]

INDEX_DTYPES = (torch.int32, torch.int64)


def check_shape(shape) -> tuple[int, int]:
    """``(M, N)`` as two Python ints; anything but a pair of non-negative integers (Python
    or NumPy ints, 0-dim integer tensors; not floats, strings or bools) is refused."""
    hint = "pass two non-negative integers, e.g. shape=(num_rows, num_cols)"
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or len(shape) != 2:
        raise ValueError(f"shape must be a pair (rows, cols), got {shape!r}; {hint}.")
    sizes = []
    for s in shape:
        try:
            if isinstance(s, bool) or getattr(s, "dtype", None) == torch.bool:
                raise TypeError
            sizes.append(operator.index(s))
        except TypeError:
            raise TypeError(
                f"shape must hold integers, got {tuple(shape)!r} ({type(s).__name__} "
                f"{s!r}); {hint}."
            ) from None
    if min(sizes) < 0:
        raise ValueError(f"shape must hold non-negative sizes, got {tuple(sizes)}; {hint}.")
    return sizes[0], sizes[1]


def check_csr(indptr, indices, values, shape) -> tuple[int, int]:
    """Validate CSR tensors; raise ``TypeError``/``ValueError`` that names the argument."""
    for name, t in (("indptr", indptr), ("indices", indices)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")
        if t.dtype not in INDEX_DTYPES:
            raise TypeError(f"{name} must be int32 or int64, got {t.dtype}; cast with .long().")
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}.")
    if indptr.dtype != indices.dtype:
        raise TypeError(
            f"indptr ({indptr.dtype}) and indices ({indices.dtype}) must share one index dtype."
        )
    if indptr.device != indices.device:
        raise ValueError(f"indptr is on {indptr.device} but indices on {indices.device}.")
    m, n = check_shape(shape)
    if indptr.numel() != m + 1:
        raise ValueError(f"indptr has {indptr.numel()} entries; a {m}-row matrix needs {m + 1}.")
    if values is not None:
        if not isinstance(values, torch.Tensor):
            raise TypeError(f"values must be a torch.Tensor or None, got {type(values).__name__}.")
        if not values.is_floating_point():
            raise TypeError(f"values must be floating point, got {values.dtype}.")
        if values.dim() != 1 or values.numel() != indices.numel():
            raise ValueError(
                f"values must have shape ({indices.numel()},) like indices, got "
                f"{tuple(values.shape)}."
            )
        if values.device != indices.device:
            raise ValueError(f"values are on {values.device} but indices on {indices.device}.")
    return m, n


def check_csr_data(indptr: torch.Tensor, indices: torch.Tensor, shape) -> None:
    """Validate the contents of CSR index arrays (one pass over them; done once per structure).

    Raises ``ValueError`` naming the first problem: ``indptr`` must start at 0, never
    decrease and end at ``nnz``; every column id must lie in ``[0, N)``.
    """
    m, n = int(shape[0]), int(shape[1])
    nnz = indices.numel()
    if m + 1 != indptr.numel():
        raise ValueError(f"indptr has {indptr.numel()} entries; a {m}-row matrix needs {m + 1}.")
    first, last = int(indptr[0]), int(indptr[-1])
    if first != 0:
        raise ValueError(f"indptr must start at 0, got indptr[0]={first}.")
    if last != nnz:
        raise ValueError(
            f"indptr must end at the number of stored entries ({nnz}), got indptr[-1]={last}."
        )
    if m and bool((indptr[1:] < indptr[:-1]).any()):
        row = int(torch.nonzero(indptr[1:] < indptr[:-1])[0])
        raise ValueError(
            f"indptr must be non-decreasing, but indptr[{row + 1}]={int(indptr[row + 1])} < "
            f"indptr[{row}]={int(indptr[row])}."
        )
    if nnz:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"column index {bad} is out of range for a matrix with {n} columns; indices "
                f"must lie in [0, {n})."
            )

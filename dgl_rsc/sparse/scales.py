"""Diagonal scalings of a sparse product, ``diag(row) A diag(col)``
(:mod:`dgl_rsc.sparse.products`)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

__all__ = ["Scales", "NO_SCALES"]


class Scales(NamedTuple):
    """Diagonal scalings of a product ``diag(row) A diag(col)``; ``None`` means identity.

    ``row_divide`` divides the output rows by ``row`` (mean aggregation: ``row`` holds the
    degrees) instead of multiplying. ``hint_col`` is a column scale that the caller applies
    to the operand itself (before a dense product that sits between it and the aggregation):
    it is not applied here, only used to score rows as rows of the normalized matrix. All are
    ``(M,)``/``(N,)`` tensors without gradient. ``quant``: an
    :class:`~dgl_rsc.int8.spec.Int8State` to run the product on INT8 operands
    (:mod:`dgl_rsc.int8.spmm`), or ``None`` (the operand's own precision).
    """

    row: Optional[torch.Tensor] = None
    col: Optional[torch.Tensor] = None
    row_divide: bool = False
    hint_col: Optional[torch.Tensor] = None
    quant: Optional[object] = None

    @property
    def is_identity(self) -> bool:
        return self.row is None and self.col is None

    def row_factor(self) -> Optional[torch.Tensor]:
        """``(M,)`` multiplicative row factor (the reciprocal when dividing), or ``None``."""
        if self.row is None:
            return None
        return 1.0 / self.row if self.row_divide else self.row

    def score_col(self) -> Optional[torch.Tensor]:
        """The column scale the row scores use: the applied one, else the hint."""
        return self.col if self.col is not None else self.hint_col

    def transposed(self) -> Scales:
        """The scales of ``(diag(r) A diag(c))^T = diag(c) A^T diag(r)`` (a division becomes
        a multiplication by the reciprocal)."""
        return Scales(self.col, self.row_factor(), False, quant=self.quant)


NO_SCALES = Scales()

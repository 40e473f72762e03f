"""The product dispatch: scales, their transpose, and the SDDMM over several chunks."""

import torch

from dgl_rsc.products import Scales, csr_mm, csr_t_mm, sddmm

from .conftest import power_law_csr


def test_scales_transpose_and_row_factor():
    r, c = torch.tensor([2.0, 4.0]), torch.tensor([3.0, 5.0, 7.0])
    s = Scales(row=r, col=c, row_divide=True)
    torch.testing.assert_close(s.row_factor(), 1 / r)
    t = s.transposed()
    assert t.row is c and not t.row_divide
    torch.testing.assert_close(t.col, 1 / r)
    assert Scales(hint_col=c).score_col() is c and Scales(col=r, hint_col=c).score_col() is r
    assert Scales().is_identity and not s.is_identity


def test_sddmm_over_several_chunks_with_scales():
    A = power_law_csr(150, 6.0, weighted=True, seed=4)
    dY, X = torch.randn(150, 5), torch.randn(150, 5)
    r, c = torch.rand(150) + 0.5, torch.rand(150) + 0.5
    sc = Scales(row=r, col=c)
    got = sddmm(A, dY, X, sc, chunk=97)  # several chunks, the last one partial
    rows, cols = A.row_ids(), A.indices.long()
    expect = (dY[rows] * X[cols]).sum(1) * r[rows] * c[cols]
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-6)


def test_transposed_product_is_the_transpose_of_the_scaled_matrix():
    A = power_law_csr(120, 5.0, weighted=True, seed=5)
    Y = torch.randn(120, 3, dtype=torch.float64)
    r, c = torch.rand(120, dtype=torch.float64) + 0.5, torch.rand(120, dtype=torch.float64) + 0.5
    sc = Scales(row=r, col=c, row_divide=True)
    D = A.to_dense(torch.float64) / r[:, None] * c[None, :]
    torch.testing.assert_close(csr_mm(A, Y, sc), D @ Y)
    torch.testing.assert_close(csr_t_mm(A, Y, sc), D.t() @ Y)

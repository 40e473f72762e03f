"""The message codec (``dgl_rsc.distributed.quant``) through its torch reference path.

Statistical checks draw many independent encodings of the same rows at once (the rows are
repeated, each copy gets its own ``u``) with a fixed seed; means and variances are taken in
float64. The standard error used is the largest the codec allows (``s / 2 / sqrt(N)`` for a
quantization step ``s``), so a biased codec (rounding to nearest, or floor without ``u``)
is off by hundreds of standard errors while the correct one stays within a few.
"""

from __future__ import annotations

import doctest
import math

import pytest
import torch

from dgl_rsc.base import _deps
from dgl_rsc.distributed import quant

N_DRAWS = 4000
DIM = 37  # odd: the last code byte of a row is partly padding


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def hard_rows(dim=DIM, seed=1):
    """Named rows covering the codec's corner cases."""
    g = gen(seed)
    rows = {
        "normal": torch.randn(dim, generator=g) * 2,
        "shifted": 1000 + torch.rand(dim, generator=g),  # |min| >> range: the offset's rounding
        "constant_on_grid": torch.full((dim,), 3.0),
        "constant_off_grid": torch.full((dim,), 1 / 3),  # not a bf16 value: quantized
        "zero": torch.zeros(dim),
        "huge": torch.randn(dim, generator=g) * 1e30,
        "tiny": torch.randn(dim, generator=g) * 1e-30,
        "subnormal": torch.rand(dim, generator=g) * 1e-40,
        "positive": torch.rand(dim, generator=g).exp(),
    }
    return list(rows), torch.stack(list(rows.values()))


def draws(x, bits, n=N_DRAWS, seed=0, dtype=torch.float64):
    """``(n, R, D)`` decodings of ``x`` and the packed message of the repeated rows."""
    packed = quant.encode(x.repeat(n, 1), bits, generator=gen(seed))
    return quant.decode(packed, torch.float32).to(dtype).view(n, *x.shape), packed


def scales(packed, bits):
    """Per-row offset and scale (float64) read back from a one-group payload."""
    r = packed.layout.rows[0]
    meta = packed.payload[quant.HEADER_BYTES : quant.HEADER_BYTES + 4 * r].view(torch.int16)
    meta = meta.view(r, 2).int()
    off = (meta[:, 0] * 65536).view(torch.float32).double()
    s = ((meta[:, 1] & 0x7FFF) * 65536).view(torch.float32).double()
    return off, s, meta[:, 1] < 0


def bf16_ulp(x):
    """bf16 grid spacing at ``x`` (float32 values): 2^(e - 7), or 2^-133 for subnormals."""
    e = (x.float().view(torch.int32) >> 23) & 0xFF
    return torch.ldexp(torch.ones_like(x, dtype=torch.float64), (e.clamp(min=1) - 134).double())


# -- sizes and the wire format ------------------------------------------------------------------
def test_payload_bytes():
    d = 256
    per_row = {2: 4 + 64, 4: 4 + 128, 8: 4 + 256, 16: 512, 32: 1024}
    for bits, row in per_row.items():
        for r in (0, 1, 3, 1000):
            expect = -(-(16 + r * row) // 16) * 16
            assert quant.payload_bytes(r, d, bits) == expect
    # odd sizes: 16 + rows * (4 + ceil(5 * bits / 8)), padded to a multiple of 16
    assert [quant.payload_bytes(1, 5, b) for b in (2, 4, 8)] == [32, 32, 32]
    assert [quant.payload_bytes(3, 5, b) for b in (2, 4, 8, 16, 32)] == [48, 48, 48, 48, 80]
    layout = quant.Layout(7, (3, 0, 5), (2, 16, 32))
    assert layout.nbytes == sum(quant.payload_bytes(r, 7, b) for r, b in [(3, 2), (0, 16), (5, 32)])
    x = torch.randn(8, 7)
    assert quant.encode_groups(x, (3, 0, 5), (2, 16, 32)).payload.numel() == layout.nbytes


def test_wire_format_golden_bytes():
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 3.0]])
    p = quant.encode(x, 2, generator=gen())
    header = b"QZ" + bytes([1, 2]) + (1).to_bytes(4, "little") + (5).to_bytes(4, "little")
    header += (0).to_bytes(2, "little") + (1).to_bytes(2, "little")
    meta = bytes([0x00, 0x00, 0x80, 0x3F])  # offset 0.0, scale 1.0 (bf16 0x3F80)
    codes = bytes([0 | 1 << 2 | 2 << 4 | 3 << 6, 3])  # first entry in the lowest bits
    assert bytes(p.payload.tolist()) == header + meta + codes + bytes(10)
    assert torch.equal(quant.decode(p), x)
    # a special row: reserved codes 13/14/15 = NaN/+inf/-inf at 4 bits, scale's bit 15 set
    y = torch.tensor([[float("nan"), 1.0, float("inf"), -float("inf")]])
    p = quant.encode(y, 4, generator=gen())
    body = bytes(p.payload[16:22].tolist())
    assert body == bytes([0x80, 0x3F, 0x00, 0x80, 13 | 0 << 4, 14 | 15 << 4])
    torch.testing.assert_close(quant.decode(p), y, equal_nan=True)


@pytest.mark.parametrize("bits", quant.BITS)
@pytest.mark.parametrize("shape", [(0, 5), (1, 1), (7, 1), (5, 3), (9, 13), (4, 64)])
def test_packing_round_trip_exact(bits, shape):
    """Rows whose values lie on the quantization grid come back exactly, for every width and
    odd shapes: codes survive packing and unpacking bit for bit."""
    r, d = shape
    g = gen(r * 100 + d)
    if bits in quant.QUANT_BITS:
        full = (1 << bits) - 1
        x = torch.randint(0, full + 1, (r, d), generator=g).float()
        if d > 1:
            x[:, 0], x[:, -1] = 0.0, float(full)  # offset 0, scale exactly 1
        x = x * 0.5 - 7.0  # a bf16 offset and scale: still exact
    else:
        x = torch.randn(r, d, generator=g).bfloat16().float()
    p = quant.encode(x, bits, generator=g)
    assert p.nbytes == quant.payload_bytes(r, d, bits)
    assert torch.equal(quant.decode(p), x)
    assert quant.Layout.from_payload(p.payload) == p.layout
    assert torch.all(p.payload[quant.HEADER_BYTES + _used(r, d, bits) :] == 0)  # padding


def _used(r, d, bits):
    return r * (4 + -(-d * bits // 8)) if bits in quant.QUANT_BITS else r * d * bits // 8


def test_empty_and_zero_width():
    for bits in quant.BITS:
        p = quant.encode(torch.zeros(0, 4), bits)
        assert p.nbytes == 16 and quant.decode(p).shape == (0, 4)
        p = quant.encode(torch.zeros(3, 0), bits)
        assert quant.decode(p).shape == (3, 0)


# -- statistics ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", quant.QUANT_BITS + (16,))
def test_unbiased_and_variance_bound(bits):
    names, x = hard_rows()
    y, packed = draws(x, bits)
    mean, var = y.mean(0), y.var(0)
    x64 = x.double()
    if bits == 16:
        step = bf16_ulp(x)
    else:
        _, s, special = scales(packed, bits)
        assert not special.any()
        step = s.view(N_DRAWS, -1)[0][:, None].expand_as(x64)
    se = step / 2 / math.sqrt(N_DRAWS)  # the largest standard error the codec allows
    exact = se == 0
    assert torch.equal(mean[exact], x64[exact]), "a zero-variance entry is not exact"
    z = (mean - x64)[~exact] / se[~exact]
    assert z.abs().max() < 4.5, f"{bits} bits: bias of {z.abs().max():.2f} standard errors"
    assert abs(z.mean()) < 3 / math.sqrt(z.numel()), f"{bits} bits: mean z {z.mean():.3f}"
    ratio = var[~exact] / (step[~exact] ** 2 / 4)
    assert ratio.max() < 1.3, f"{bits} bits: variance {ratio.max():.3f} x the bound s^2/4"
    for name in ("constant_on_grid", "zero"):
        i = names.index(name)
        assert torch.equal(y[:, i], x64[i].expand_as(y[:, i])), f"{name} row is not exact"
    assert torch.isfinite(y).all()


def test_unbiased_special_row():
    """Finite entries of a row with NaN/inf stay unbiased; the others arrive as what they were
    (2 bits: all NaN)."""
    x = torch.randn(2, DIM, generator=gen(5))
    x[0, 3], x[0, 8], x[0, 20], x[0, 30] = float("nan"), float("inf"), -float("inf"), 3e38
    for bits in quant.QUANT_BITS:
        y, packed = draws(x, bits, n=2000)
        _, s, special = scales(packed, bits)
        assert special.view(2000, 2)[:, 0].all() and not special.view(2000, 2)[:, 1].any()
        finite = torch.isfinite(x[0]) & (x[0].abs() < 1e30)
        se = s.view(2000, 2)[0, 0] / 2 / math.sqrt(2000)
        z = (y[:, 0, finite].mean(0) - x[0, finite].double()) / se
        assert z.abs().max() < 4.5
        got = y[:, 0, [3, 8, 20, 30]]
        if bits == 2:
            assert torch.isnan(got).all()
        else:
            assert torch.isnan(got[:, 0]).all() and (got[:, 1] == math.inf).all()
            assert (got[:, 2] == -math.inf).all() and (got[:, 3] == math.inf).all()
        assert torch.isfinite(y[:, 1]).all()


def test_nonfinite_16_and_32_bits():
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), 3.4e38, -3.4e38, 1.0]])
    for bits in (16, 32):
        y = quant.decode(quant.encode(x, bits, generator=gen()))
        assert torch.isnan(y[0, 0]) and y[0, 1] == math.inf and y[0, 2] == -math.inf
        assert torch.isfinite(y[0, 3:]).all(), "a finite value became inf"
        assert y[0, 5] == 1.0
    big = quant.decode(quant.encode(x, 16, generator=gen()))[0, 3]
    assert big == torch.finfo(torch.bfloat16).max  # rounded down, not to inf
    # fp64 beyond fp32's range becomes inf, as it would in a fp32 exchange (documented)
    assert (
        quant.decode(quant.encode(torch.tensor([[1e300]], dtype=torch.float64), 32))[0, 0]
        == math.inf
    )


# -- dtypes, groups, randomness -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_input_dtypes(dtype):
    x = (torch.randn(6, 9, generator=gen(2)) * 3).to(dtype)
    for bits in quant.BITS:
        p = quant.encode(x, bits, generator=gen(3))
        y = quant.decode(p)
        assert y.dtype == dtype and y.shape == x.shape
        ref = quant.encode(x.float(), bits, generator=gen(3))
        assert torch.equal(p.payload, ref.payload)  # the codec works on x.float()
        assert torch.equal(y, quant.decode(ref).to(dtype))
    if dtype == torch.bfloat16:  # bf16 input at 16 bits: exact
        assert torch.equal(quant.decode(quant.encode(x, 16, generator=gen())), x)
    if dtype == torch.float16:  # a decoded value above 65504 saturates instead of becoming inf
        row = torch.tensor([[0.0, 65504.0, 30000.0]], dtype=dtype).repeat(500, 1)
        assert torch.isfinite(quant.decode(quant.encode(row, 2, generator=gen()))).all()


def test_groups_match_separate_messages():
    x = torch.randn(10, 7, generator=gen(4))
    rows, bits = (3, 0, 2, 5), (2, 32, 16, 8)
    packed = quant.encode_groups(x, rows, bits, generator=gen(9))
    g, parts, start = gen(9), [], 0
    for r, b in zip(rows, bits):
        p = quant.encode(x[start : start + r], b, generator=g).payload
        p[14] = len(rows)  # header: group count
        p[12] = len(parts)  # header: group index
        parts.append(p)
        start += r
    assert torch.equal(packed.payload, torch.cat(parts))
    assert quant.Layout.from_payload(packed.payload) == packed.layout
    y = quant.decode(packed)
    assert torch.equal(y[:3], quant.decode(quant.encode(x[:3], 2, generator=gen(9))))
    torch.testing.assert_close(y[5:], x[5:], atol=0.05, rtol=0)
    # rows of a per-row group id, sorted with group_order and restored after decoding
    gid = torch.tensor([2, 0, 1, 0, 2, 2, 1, 0, 0, 1])
    order, counts = quant.group_order(gid, 3)
    assert counts == (4, 3, 3) and torch.equal(gid[order], gid.sort().values)
    p = quant.encode_groups(x[order], counts, (32, 32, 32))
    assert torch.equal(quant.decode(p)[torch.argsort(order)], x)


def test_reproducible_with_generator():
    x = torch.randn(20, 11, generator=gen(6))
    for bits in (2, 4, 8, 16):
        a = quant.encode(x, bits, generator=gen(1)).payload
        assert torch.equal(a, quant.encode(x, bits, generator=gen(1)).payload)
        assert not torch.equal(a, quant.encode(x, bits, generator=gen(2)).payload)


def test_row_ranges():
    """The range is ``max - offset`` with the offset the row minimum rounded down to bf16."""
    names, x = hard_rows()
    r, lo, hi = quant.row_ranges(x).double(), x.amin(1).double(), x.amax(1).double()
    assert torch.all(r >= (hi - lo) * (1 - 1e-6))
    assert torch.all(r <= (hi - lo) * (1 + 1e-6) + bf16_ulp(x.amin(1)))
    for name in ("zero", "constant_on_grid"):
        assert r[names.index(name)] == 0
    assert r[names.index("constant_off_grid")] > 0


# -- errors and dispatch ------------------------------------------------------------------------
def test_errors():
    x = torch.randn(4, 3)
    for bad in (3, 0, 1, 64, True, 8.0, "8"):
        with pytest.raises(ValueError, match="bits must be one of"):
            quant.encode(x, bad)
    with pytest.raises(ValueError, match=r"group_bits\[1\] must be one of"):
        quant.encode_groups(x, (2, 2), (4, 5))
    with pytest.raises(ValueError, match="sum to 3 but x has 4"):
        quant.encode_groups(x, (1, 2), (4, 4))
    with pytest.raises(ValueError, match="one bit width per group"):
        quant.encode_groups(x, (2, 2), (4,))
    with pytest.raises(ValueError, match="2-D"):
        quant.encode(torch.randn(3), 8)
    with pytest.raises(TypeError, match="float32"):
        quant.encode(torch.ones(2, 2, dtype=torch.int64), 8)
    with pytest.raises(TypeError, match="torch.Tensor"):
        quant.encode([[1.0]], 8)
    p = quant.encode(x, 8)
    with pytest.raises(ValueError, match="bytes for this layout"):
        quant.decode(quant.Packed(p.payload[:-16], p.layout))
    with pytest.raises(TypeError, match="dtype must be"):
        quant.decode(p, torch.int32)
    with pytest.raises(ValueError, match="no quant message header"):
        quant.Layout.from_payload(torch.zeros(32, dtype=torch.uint8))
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        quant.encode(x, 8, backend="gpu")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        quant.encode(x, 8, backend="cupy")


def test_dispatch_cpu():
    assert quant.resolve_backend("auto", "cpu") is quant.resolve_backend("torch", "cpu")
    if not _deps.numba_cuda_available():
        with pytest.raises(ImportError, match="numba"):
            quant.resolve_backend("numba", "cpu")


def test_doctests():
    assert doctest.testmod(quant).failed == 0

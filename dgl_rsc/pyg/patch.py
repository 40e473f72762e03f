"""``dgl_rsc.pyg.patch``: train unmodified PyTorch Geometric models with RSC's backward.

Inside the block:

- ``GCNConv.forward``, ``SAGEConv.forward`` (``aggr="mean"``) and ``GCN2Conv.forward`` of
  ``torch_geometric.nn`` run their ``edge_index`` path on the RSC operator, the CSR of each
  graph built once and cached by the controller (for ``GCNConv``/``GCN2Conv`` keyed by the
  input ``edge_index``, so that the self-loops ``gcn_norm`` adds do not cost a sort per
  call);
- ``torch_geometric.utils.spmm`` -- and every ``spmm`` that a PyG module imported from it,
  which is what ``MessagePassing``'s fused ``message_and_aggregate`` calls for a
  ``torch.sparse`` or ``SparseTensor`` adjacency -- runs ``sum``/``mean`` products on the
  RSC operator (any layer: ``GINConv``, ``SGConv``, ``APPNP``... on a sparse adjacency).

A call is taken over only when the engine computes it as PyG does: 2-D features in fp32/fp64
(any float on CUDA), one number per edge, no message-passing hooks, explain mode or
decomposed layers, and a class that keeps the stock ``message``/``aggregate`` (a subclass
with its own messages passes through). Everything else runs PyG's code unchanged, and the
patch warns once per layer class (and reason) whose training forward ran without any RSC
product, so that a model is never silently exact while the block claims RSC.

The i-th approximated product of a training step is product i of the controller; call
``rsc.step()`` once per optimizer step. Only the thread that opened the block feeds the
controller. On exit, normal or by an exception, every replaced symbol is put back and the
module hooks are removed. Blocks do not nest.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from typing import Iterator, Union

import torch

from ..base import _deps
from ..base.flags import require_flag
from ..base.memory import freed_memory_kept
from ..base.user_warnings import warn_user
from ..core.config import RSCConfig
from ..core.controller import RSCController
from ..core.disabled import disabled_controller
from ..core.ops import compiling
from ..core.ops import handle as op_handle
from ..dgl.nn.input_cache import InputAggregationCache
from .forwards import Front, fused_product, gcn2_forward, gcn_forward, sage_forward

__all__ = ["patch", "is_patched", "patched_symbols", "COVERED"]

_MARK = "__dgl_rsc_pyg_patch__"
_ACTIVATION = threading.Lock()

#: ``torch_geometric.nn`` class -> the forward that runs it on the RSC operator
COVERED = {"GCNConv": gcn_forward, "SAGEConv": sage_forward, "GCN2Conv": gcn2_forward}
#: methods a subclass must not override for its forward to be taken over
_STOCK_METHODS = ("message", "aggregate", "message_and_aggregate", "update", "propagate")

UNCOVERED_MESSAGE = (
    "dgl_rsc.pyg.patch: {name} ran its training forward with PyG's exact message passing "
    "({reason}), so its backward is exact (no RSC). The patch covers GCNConv, SAGEConv "
    "(mean) and GCN2Conv on edge_index, and sum/mean products of torch.sparse or "
    "SparseTensor adjacencies (PyG's spmm), with 2-D fp32/fp64 features."
)


def _spmm_owners(original) -> list:
    """Every loaded ``torch_geometric`` module that holds ``original`` as ``spmm``."""
    return [
        mod
        for name, mod in sorted(sys.modules.items())
        if name.startswith("torch_geometric")
        and getattr(mod, "__dict__", {}).get("spmm") is original
    ]


def patched_symbols() -> list:
    """``[(owner, attribute name)]`` of every symbol the patch replaces."""
    tg = _deps.require_torch_geometric()
    import torch_geometric.utils._spmm as spmm_mod

    out = [(getattr(tg.nn, name), "forward") for name in COVERED]
    return out + [(mod, "spmm") for mod in _spmm_owners(spmm_mod.spmm)]


def is_patched() -> bool:
    """``True`` while a ``dgl_rsc.pyg.patch`` block is active."""
    tg = _deps.require_torch_geometric()
    return getattr(tg.nn.GCNConv.forward, _MARK, False)


class _Watch:
    """The block's bookkeeping: products taken over, the message-passing modules running (so
    that a product inside an evaluation forward takes no slot), and the warnings given."""

    def __init__(self, ctl: RSCController, owner: int, cache_inputs: bool = True):
        self.ctl, self.owner = ctl, owner
        self.taken = 0
        self.running: list[tuple] = []  # (module id, training, products taken before it)
        self.warned: set = set()
        self.cache_inputs = cache_inputs
        self.inputs: dict = {}  # id(conv) -> (conv, its InputAggregationCache) in the block

    def input_cache(self, module):
        """``module``'s cache of its input's aggregation for this block, or ``None``."""
        if not self.cache_inputs or module is None:
            return None
        entry = self.inputs.get(id(module))
        if entry is None or entry[0] is not module:
            entry = self.inputs[id(module)] = (module, InputAggregationCache())
        return entry[1]

    def owned(self) -> bool:
        """The calling thread opened the block (not asked while dynamo traces: compiled code
        runs in the thread that calls it)."""
        return compiling() or threading.get_ident() == self.owner

    def rsc(self, x, A, module=None):
        """The product's ``rsc`` argument: the controller, or ``None`` (exact, no slot) in a
        module -- the one given, else the innermost message-passing module running -- that
        is in evaluation mode."""
        if module is None and self.running:
            training = self.running[-1][1]
        else:
            training = True if module is None else module.training
        if not training:
            return None
        if not compiling():  # a traced counter would be a guard that fails every step
            self.taken += 1
        return self.ctl

    def warn(self, module, reason: str) -> None:
        """A training forward of ``module`` ran PyG's exact message passing: counted in
        ``stats()["not_approximated"]``, warned once per class and reason at the user's
        line."""
        if not (module.training and torch.is_grad_enabled()):
            return
        name = type(module).__name__
        self.ctl.note_not_approximated(f"{name}: {reason}")
        if (name, reason) not in self.warned:
            self.warned.add((name, reason))
            warn_user(UNCOVERED_MESSAGE.format(name=name, reason=reason))

    def front(self, module=None) -> Front:
        return Front(functools.partial(self.rsc, module=module), self.ctl.structures,
                     self.warn, self.input_cache, self.noted)  # fmt: skip

    def noted(self, built: bool) -> None:
        """A layer reused (``built``: computed) its input's aggregation: its product."""
        self.taken += 1
        self.ctl.note_cached_input(built)

    # global module hooks: a MessagePassing forward that took no product is reported
    def before(self, module, args):
        if self._watched(module):
            self.running.append((id(module), module.training, self.taken))

    def after(self, module, args, output):
        if not self._watched(module):
            return
        while self.running:  # a forward that raised left its entry: drop it
            key, training, start = self.running.pop()
            if key == id(module):
                if training and self.taken == start and not compiling():
                    self.warn(module, "not covered by the patch")
                return

    def _watched(self, module) -> bool:
        mp = sys.modules["torch_geometric.nn.conv"].MessagePassing
        return (
            isinstance(module, mp)
            and self.owned()
            and not hasattr(module, "rsc_attach")  # a dgl_rsc.pyg drop-in reports itself
        )


def _takes_class(module, stock_cls) -> bool:
    """``module``'s class keeps ``stock_cls``'s message passing (its own messages would be
    ignored by the RSC forward)."""
    cls = type(module)
    return cls is stock_cls or all(getattr(cls, m) is getattr(stock_cls, m) for m in _STOCK_METHODS)


def _forward_wrapper(stock_cls, rsc_forward, original, watch: _Watch):
    def forward(self, *args, **kwargs):
        out = None
        if watch.owned() and _takes_class(self, stock_cls):
            out = rsc_forward(self, watch.front(self), *args, **kwargs)
        return original(self, *args, **kwargs) if out is None else out

    forward.__doc__ = original.__doc__
    setattr(forward, _MARK, True)
    return forward


def _spmm_wrapper(original, watch: _Watch):
    def spmm(src, other, reduce: str = "sum"):
        out = fused_product(watch.front(), src, other, reduce) if watch.owned() else None
        return original(src, other, reduce) if out is None else out

    spmm.__doc__ = original.__doc__
    setattr(spmm, _MARK, True)
    return spmm


@contextlib.contextmanager
def patch(
    config: Union[None, RSCConfig, RSCController] = None,
    *,
    enabled: bool = True,
    keep_freed_memory: bool = True,
    cache_inputs: bool = True,
    **overrides,
) -> Iterator[RSCController]:
    """Run PyG's sparse aggregations on RSC's operator for the duration of the block.

    Args:
        config: an :class:`~dgl_rsc.RSCConfig`, an existing controller, or ``None``.
        enabled: ``False`` makes the block a no-op (PyG runs stock; the yielded controller's
            ``step()`` does nothing and its ``stats()`` says ``enabled: False``), so that
            one loop compares stock and RSC.
        keep_freed_memory: glibc keeps freed large blocks for reuse while the block lasts
            (:func:`dgl_rsc.base.memory.freed_memory_kept`; restored on exit, left alone
            where the process or its user set the allocator); numbers unchanged.
        cache_inputs: a ``GCNConv``/``SAGEConv`` whose input needs no gradient (the
            dataset's features, no input dropout) aggregates it once and reuses it while
            the same unchanged tensors come back; ``GCNConv`` then aggregates before its
            transform (``(A X) W``, equal to PyG's ``A (X W)`` up to rounding) and its
            backward has no sparse product. ``False``: PyG's order at every call.
        **overrides: :class:`~dgl_rsc.RSCConfig` fields (``budget=0.1``,
            ``total_steps=...``).

    Yields:
        The :class:`~dgl_rsc.RSCController`: call ``step()`` once per optimizer step,
        read ``stats()`` for what RSC did.

    Raises:
        TypeError: ``enabled``, ``keep_freed_memory`` or ``cache_inputs`` is not ``True`` or
            ``False``.

    Example (needs torch_geometric)::

        with dgl_rsc.pyg.patch(budget=0.1, total_steps=200) as rsc:
            for epoch in range(200):
                loss = F.cross_entropy(model(x, edge_index)[train], y[train])
                opt.zero_grad(); loss.backward(); opt.step(); rsc.step()
    """
    _deps.require_torch_geometric()
    enabled = require_flag(enabled, "dgl_rsc.pyg.patch(enabled=...)")
    keep_freed_memory = require_flag(keep_freed_memory,
                                     "dgl_rsc.pyg.patch(keep_freed_memory=...)")  # fmt: skip
    cache_inputs = require_flag(cache_inputs, "dgl_rsc.pyg.patch(cache_inputs=...)")
    if not enabled:
        yield disabled_controller(config, **overrides)
        return
    rsc = RSCController.coerce(config, **overrides)
    op_handle(rsc)  # known to the custom operators before torch.compile traces
    watch = _Watch(rsc, threading.get_ident(), cache_inputs)
    with _ACTIVATION:
        if is_patched():
            raise RuntimeError(
                "a dgl_rsc.pyg.patch block is already active; patches do not nest (one "
                "controller owns the product order). Reuse the active controller instead."
            )
        symbols = patched_symbols()
        originals = {(owner, name): owner.__dict__[name] for owner, name in symbols}
        for (owner, name), original in originals.items():
            if name == "forward":
                new = _forward_wrapper(owner, COVERED[owner.__name__], original, watch)
            else:
                new = _spmm_wrapper(original, watch)
            setattr(owner, name, new)
        hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(watch.before),
            torch.nn.modules.module.register_module_forward_hook(watch.after),
        ]
    try:
        with freed_memory_kept(keep_freed_memory):
            yield rsc
    finally:
        with _ACTIVATION:
            for handle in hooks:
                handle.remove()
            for (owner, name), original in originals.items():
                setattr(owner, name, original)

"""``RSCConfig``: one validated configuration for the patch, the layers and the launcher."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Union

from ..base.names import did_you_mean
from ..base.user_warnings import warn_user
from ..sampling.rules import RULES as _RULES

__all__ = [
    "RSCConfig",
    "warn_never_exact",
    "ConfigError",
    "BACKENDS",
    "RULES",
    "RESCALES",
    "DIAGONALS",
    "RESTRICTS",
    "unknown_key_message",
]

BACKENDS = ("auto", "torch", "cupy", "numba", "numba-cpu")
RULES = tuple(_RULES)  # the names of the registered selection rules
RESCALES = ("ls", "mass", "none")
AUTO = "auto"
#: under ``budget: auto``, the non-zero fraction of a layer before its first tune
AUTO_START = 0.5
DIAGONALS = ("sample", "exact")
#: ``RSCConfig.restrict``: off, the input gradient alone, or with the parameter gradients
RESTRICTS = ("off", "rows", "weights")


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names the key and the fix."""


def unknown_key_message(key: str, allowed, where: str = "") -> str:
    """Message for an unknown key: lists the allowed keys and the nearest match."""
    allowed = sorted(allowed)
    hint = did_you_mean(key, allowed)
    place = f" in {where}" if where else ""
    return f"unknown key '{key}'{place}.{hint} Allowed keys: {', '.join(allowed)}."


@dataclasses.dataclass(frozen=True)
class RSCConfig:
    """Settings of Randomized Sparse Computations.

    Attributes:
        budget: fraction C in (0, 1] of the exact backward sparse work that the approximate
            backward may spend, summed over layers:
            ``sum_l nnz(A[S_l]) d_l <= C sum_l nnz(A) d_l``; or ``"auto"``: at each tune every
            layer gets the smallest non-zero fraction whose estimated relative gradient error
            (:mod:`dgl_rsc.sampling.error`) is at most ``target_error``. The default 0.2
            reached exact training's accuracy at least as soon as exact, on the mean over the
            seeds that reached it, on every graph of the time-to-accuracy suite it ran on
            (every seed reached it but one of Cora's 10, one of the 40k-node graph's 5 and one
            of the 200k preset's 5 on an H100); 0.1 fell short on the graphs with 100 edges per
            node (``docs/benchmarks.md``, *The default budget is 0.2*).
        target_error: the relative error ``||G - G~|| / ||G||`` of each layer's sampled
            product that ``budget: auto`` aims for, in (0, 1).
        guard: watch the approximate phase and act when it falls behind
            (:mod:`dgl_rsc.core.guard`): a layer whose estimated error says the sample captures
            almost nothing, or a training loss (passed to ``step(loss)``) rising against its
            own recent past, raises the budget, and a second time switches to the exact
            backward early. Every action is listed in ``stats()["guard"]``.
        cache_interval: uses of a matrix between re-samplings of its kept rows (>= 1); the
            sliced sparse structure is reused in between (full-graph training: steps).
        tune_interval: steps between re-allocations of the budget across layers (>= 1). A
            tune probes every product's error the step before (with the guard or ``budget:
            auto``) and re-solves, which costs about a step's saving; the default, twice the
            cache interval, tunes at every other refresh.
        switch_at: fraction of ``total_steps`` after which the backward is exact (1.0 = never).
        switch_patience: evaluations in a row without a new best validation metric, during
            the approximate phase, after which the backward is exact for the rest of the run
            (``>= 0``; 0: off). The validation metric comes from
            ``RSCController.observe_validation(value)`` (the launcher calls it at each
            evaluation); without it only ``switch_at`` switches. Whichever comes first
            switches (:mod:`dgl_rsc.core.schedule`).
        switch_returns: a new best validation metric in the exact phase of a plateau switch
            approximates again, until the next plateau (default ``False``: the plateau
            switch is for good).
        total_steps: the number of optimizer steps of the run; ``None`` disables switching.
        warmup_steps: exact steps at the start that only record scores (>= 0).
        min_k: the fewest rows any layer keeps (>= 0; a sample keeps at least one row with a
            non-zero score in any case, so a tiny budget never zeroes the gradient; with
            ``diagonal="exact"`` the exact diagonal term plays that part).
        min_width: products whose gradient ``dY`` has fewer columns than this keep the exact
            backward (typically a classifier's last layer), and the budget is shared by the
            others. At 10 columns a refresh, the error probe and the per-step passes cost more
            than visiting fewer non-zeros saves, and the sampling noise slows convergence
            for nothing (measured on the CPU: ``docs/benchmarks.md``, *Narrow products stay
            exact*: 16, the default, reached exact's accuracy sooner on every graph tried).
            ``0``: approximate every product. A two-layer GCN whose last layer multiplies the
            weight first has only that product to approximate: with fewer classes than
            ``min_width`` it trains exactly (``stats()["layers"][i]["narrow"]``).
        rule: ``"topk"`` keeps rows by score ``s_i`` (the paper); ``"cost"`` keeps rows by
            ``s_i^2 / nnz_i`` (the fractional-knapsack rule for the left-out energy).
        ema: weight of the newest score in the running average, in (0, 1].
        rescale: the scale of the sampled product when ``remainder_groups`` is 0 (with
            groups the estimate needs none). ``"ls"`` (default): the least-squares
            factor ``<G_S, G> / ||G_S||^2``, estimated at each refresh from ``probe_rows``
            dropped rows drawn by score and clipped to ``[1, total / kept score mass]`` (1 when
            the dropped rows' contributions are independent, larger when they align with the
            kept ones, as training gradients do; ``docs/benchmarks.md``); ``"mass"``: total /
            kept score mass; ``"none"``: unscaled (the paper). ``true``/``false`` read as
            ``"ls"``/``"none"``.
        diagonal: ``"sample"`` (default) treats a self-loop diagonal like any other entry;
            ``"exact"`` always applies it exactly and samples the off-diagonal rows with the
            rest of the budget (its ``N`` entries count as work; measured to lose at equal
            work on graphs of average degree 20-100).
        remainder_groups: ``K >= 1`` (default 10): the rows of each matrix are split once at
            random into ``K`` groups, and each step adds one group's product, without the
            sample's rows, times ``K``, in turn from a random group
            (:mod:`dgl_rsc.sampling.remainder`): the step's product is then an unbiased
            estimate of the exact one, for about ``1/K`` of the non-zeros more per step
            (nothing more to cut at a refresh), and a cached sample no
            longer leaves out the same rows step after step (which is what slowed the
            approximate phase's convergence: ``docs/benchmarks.md``). The sample itself is not
            rescaled then (``rescale`` applies only with ``0``). ``0``: the dropped rows are
            left out, as in the paper.
        probe_rows: dropped rows drawn per refresh to estimate the ``"ls"`` scale (>= 1).
        subgraph_cache: mini-batch training: per product, the states (running scores, cached
            sample) of this many subgraphs besides the current one are kept, so a subgraph
            that comes back reuses them (>= 0).
        check_finite: make the sampled product non-finite wherever the exact one would be (a
            NaN or Inf in a row of ``dY`` the sample left out would otherwise vanish); costs
            one pass over ``dY`` and one matrix-vector product per step.
        backend: the sampling kernels: ``"auto"`` (CuPy on CUDA, Numba's CPU kernels on the
            CPU, torch where neither runs), ``"torch"`` (the reference), ``"cupy"``,
            ``"numba"`` (Numba-CUDA) or ``"numba-cpu"``.
        restrict: the backward between two products computes only the rows the next
            sampled product reads (:mod:`dgl_rsc.core.restrict`; the native GCN's
            ``GraphConv`` layers without batch norm, on steps that reuse a cached sample).
            ``"off"`` (default): every row. ``"rows"``: the input-gradient GEMM of an
            aggregate-first layer on those rows, every parameter gradient exact (they sum
            over all rows, so the elementwise backwards keep every row). ``"weights"``: the
            dense and elementwise backwards on those rows only, and the bias and weight
            gradients that sum over them estimated from those rows with the sample's weights
            (1 on the sample's rows, ``remainder_groups`` on the step's group): unbiased
            given the sample, exact at budget 1.
        seed: seed of the rows drawn for the ``"ls"`` scale (each layer draws from its own
            generator, seeded from ``seed`` and its index; saved in checkpoints).
    """

    budget: Union[float, str] = 0.2
    target_error: float = 0.3
    guard: bool = True
    cache_interval: int = 10
    tune_interval: int = 20
    switch_at: float = 0.8
    switch_patience: int = 0
    switch_returns: bool = False
    total_steps: Optional[int] = None
    warmup_steps: int = 2
    min_k: int = 10
    min_width: int = 16
    rule: str = "cost"
    ema: float = 0.5
    rescale: str = "ls"
    diagonal: str = "sample"
    remainder_groups: int = 10
    probe_rows: int = 256
    check_finite: bool = True
    subgraph_cache: int = 32
    backend: str = "auto"
    restrict: str = "off"
    seed: int = 0

    def __post_init__(self):
        if self.budget != AUTO:
            _check_number(self, "budget", float, lo=0.0, hi=1.0, lo_open=True)
        _check_number(self, "target_error", float, lo=0.0, hi=1.0, lo_open=True)
        _check_number(self, "cache_interval", int, lo=1)
        _check_number(self, "tune_interval", int, lo=1)
        _check_number(self, "switch_at", float, lo=0.0, hi=1.0)
        _check_number(self, "switch_patience", int, lo=0)
        if self.total_steps is not None:
            _check_number(self, "total_steps", int, lo=1)
        _check_number(self, "warmup_steps", int, lo=0)
        _check_number(self, "min_k", int, lo=0)
        _check_number(self, "min_width", int, lo=0)
        _check_number(self, "ema", float, lo=0.0, hi=1.0, lo_open=True)
        _check_number(self, "seed", int, lo=0)
        _check_choice(self, "rule", RULES)
        if isinstance(self.rescale, bool):  # the older boolean form
            object.__setattr__(self, "rescale", "ls" if self.rescale else "none")
        _check_choice(self, "rescale", RESCALES)
        _check_choice(self, "diagonal", DIAGONALS)
        _check_number(self, "probe_rows", int, lo=1)
        _check_number(self, "remainder_groups", int, lo=0)
        if self.remainder_groups and self.diagonal == "exact":
            raise ConfigError(
                "RSCConfig.remainder_groups needs diagonal='sample' (the groups would count an "
                "exactly applied diagonal twice); set remainder_groups=0 to apply the diagonal "
                "exactly, or diagonal='sample' to keep the groups."
            )
        _check_number(self, "subgraph_cache", int, lo=0)
        for key in ("check_finite", "guard", "switch_returns"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(
                    f"RSCConfig.{key} must be true or false, got {getattr(self, key)!r}."
                )
        _check_choice(self, "backend", BACKENDS)
        _check_choice(self, "restrict", RESTRICTS)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The allowed configuration keys."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]], where: str = "rsc") -> RSCConfig:
        """Build from a mapping (a YAML section), rejecting unknown keys by name.

        >>> RSCConfig.from_dict({"budget": 0.3}).budget
        0.3
        >>> RSCConfig.from_dict({"budjet": 0.3})
        Traceback (most recent call last):
        ...
        dgl_rsc.core.config.ConfigError: unknown key 'budjet' in rsc. Did you mean 'budget'? ...
        """
        data = dict(data or {})
        for key in data:
            if key not in cls.keys():
                raise ConfigError(unknown_key_message(key, cls.keys(), where))
        return cls(**data)

    def to_dict(self) -> dict:
        """Plain-dict view, for YAML and JSON output."""
        return dataclasses.asdict(self)

    def replace(self, **changes) -> RSCConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def auto(self) -> bool:
        """The budget is chosen per layer from ``target_error`` (``budget: auto``)."""
        return self.budget == AUTO

    @property
    def fraction(self) -> float:
        """The fixed budget, or under ``budget: auto`` the fraction of non-zeros a layer
        keeps until its first tune (:data:`AUTO_START`)."""
        return AUTO_START if self.auto else float(self.budget)

    @property
    def scale_mode(self) -> str:
        """The scale the sampled rows' product gets: ``rescale``, or ``"none"`` when the
        dropped rows are estimated by ``remainder_groups``."""
        return "none" if self.remainder_groups else self.rescale

    @property
    def switch_step(self) -> Optional[int]:
        """First step whose backward is exact again, or ``None`` when it never switches."""
        if self.total_steps is None or self.switch_at >= 1.0:
            return None
        return int(self.switch_at * self.total_steps)


def _check_number(cfg, key, kind, lo=None, hi=None, lo_open=False):
    value = getattr(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        also = " or 'auto'" if key == "budget" else ""
        raise ConfigError(f"RSCConfig.{key} must be a number{also}, got {value!r}.")
    rng = f"{'(' if lo_open else '['}{lo}, {hi if hi is not None else 'inf'}]"
    # NaN fails every comparison; an int is exact at any size, but float() of it may overflow
    too_big = not (kind is int and isinstance(value, int)) and abs(value) > 1.7976931348623157e308
    if too_big or not -float("inf") < value < float("inf"):
        raise ConfigError(f"RSCConfig.{key}={value!r} is not a finite number; give one in {rng}.")
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"RSCConfig.{key} must be an integer, got {value!r}.")
    value = kind(value)
    object.__setattr__(cfg, key, value)
    bad_lo = lo is not None and (value <= lo if lo_open else value < lo)
    bad_hi = hi is not None and value > hi
    if bad_lo or bad_hi:
        raise ConfigError(f"RSCConfig.{key}={value!r} is out of range; it must lie in {rng}.")


def _check_choice(cfg, key, choices):
    value = getattr(cfg, key)
    if value not in choices:
        hint = did_you_mean(str(value), choices)
        raise ConfigError(f"RSCConfig.{key}={value!r} is not one of {', '.join(choices)}.{hint}")


def warn_never_exact(config: RSCConfig, entry: str) -> None:
    """Warn (at the user's line) when ``config`` never switches to the exact backward only
    because ``total_steps`` is missing (``entry`` names the call, e.g. ``"dgl_rsc.patch()"``)."""
    if config.total_steps is None and config.switch_at < 1.0 and not config.switch_patience:
        warn_user(
            f"{entry} has no total_steps, so it never switches to the exact backward "
            f"(switch_at={config.switch_at} needs the run's length); the exact final steps "
            "recover accuracy. Pass total_steps=<number of optimizer steps>, or "
            "switch_patience=N with rsc.observe_validation(metric) at each evaluation, or "
            "switch_at=1.0 to approximate throughout without this warning."
        )

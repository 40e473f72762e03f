"""The ``report`` section of a launcher config: how time to accuracy is measured.

::

    report:
      tta_tolerance: 0.003   # target = exact's best validation of the seed minus this
      tta_target: null       # or an absolute validation target for every method and seed

Both are in metric units: metrics are fractions in ``[0, 1]`` (accuracy, ROC-AUC, micro-F1),
so the default tolerance 0.003 is 0.3 points. Give one of the two keys, not both; an absolute
target is the only way to get a time to target without the exact run (``compare: false``).
See :mod:`dgl_rsc.launcher.tta` for the definition.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..core.config import ConfigError, unknown_key_message
from .tta import DEFAULT_TOLERANCE

__all__ = ["ReportConfig", "resolve_report"]


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """A validated ``report`` section (see the module docstring)."""

    tta_tolerance: float = DEFAULT_TOLERANCE
    tta_target: Optional[float] = None

    def to_dict(self) -> dict:
        """The section as a config gives it (the tolerance left out when a target is set)."""
        if self.tta_target is not None:
            return {"tta_target": self.tta_target}
        return dataclasses.asdict(self)


def resolve_report(raw: dict, check_value, Rule) -> ReportConfig:
    """Validate ``raw["report"]`` (absent or ``null``: the defaults)."""
    sec = raw.get("report")
    if sec is None:
        return ReportConfig()
    if not isinstance(sec, dict):
        raise ConfigError(f"report must be a mapping of keys to values, got {sec!r}.")
    allowed = [f.name for f in dataclasses.fields(ReportConfig)]
    for key in sec:
        if key not in allowed:
            raise ConfigError(unknown_key_message(str(key), allowed, "report"))
    if sec.get("tta_target") is not None and "tta_tolerance" in sec:
        raise ConfigError(
            f"report.tta_tolerance={sec['tta_tolerance']!r} and report.tta_target="
            f"{sec['tta_target']!r} are both set; keep tta_target (an absolute validation "
            "target) or tta_tolerance (below exact's best validation), not both."
        )
    tol = sec.get("tta_tolerance", DEFAULT_TOLERANCE)
    try:
        tol = check_value("report.tta_tolerance", tol, Rule(float, 0.0, 1.0, hi_open=True))
    except ConfigError as exc:
        raise ConfigError(
            f"{exc} It is in metric units (metrics are fractions): 0.003 is 0.3 points."
        ) from None
    target = check_value("report.tta_target", sec.get("tta_target"), Rule(float, optional=True))
    return ReportConfig(tol, target)

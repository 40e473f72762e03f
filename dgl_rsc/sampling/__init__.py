"""RSC's sampling core: selection rules, drawing a row sample, the sampled product's scale.

- :mod:`.rules`: the registry of selection rules (key and solver mass), the kept-row count.
- :mod:`.draw`: scoring, selection and slicing of one sample; the sampled product.
- :mod:`.scale`: the least-squares scale of the sampled product.
- :mod:`.order`: stable sort orders of score vectors (fast on the CPU).

The backends that run the steps on a device are in :mod:`dgl_rsc.backends`; the per-layer
state (cache, running scores) in :mod:`dgl_rsc.core.layer_state`.
"""

from .draw import (
    Sample,
    apply_scale,
    draw_sample,
    mass_scale,
    nonfinite_rows,
    propagate_nonfinite,
    row_norms,
    sample_product,
)
from .rules import RULES, Rule, get_rule, kept_count, selection_key
from .scale import cross_terms, estimate_ls_scale, sampled_cross_terms

__all__ = [
    "RULES",
    "Rule",
    "Sample",
    "apply_scale",
    "cross_terms",
    "draw_sample",
    "estimate_ls_scale",
    "get_rule",
    "kept_count",
    "mass_scale",
    "nonfinite_rows",
    "propagate_nonfinite",
    "row_norms",
    "sample_product",
    "sampled_cross_terms",
    "selection_key",
]

"""``DisabledController``: what ``patch(enabled=False)`` yields, so that one training loop
runs stock and RSC without an ``if`` around ``rsc.step()``."""

from __future__ import annotations

from typing import Optional

from .controller import RSCController

__all__ = ["DisabledController", "disabled_controller"]


class DisabledController(RSCController):
    """A controller that takes no product: ``step()`` does nothing; ``stats()`` says
    ``enabled: False`` and reports no visited fraction (nothing was approximated)."""

    def step(self, loss: Optional[float] = None) -> None:
        """Nothing: the patch is off."""

    def next_layer(self):
        raise RuntimeError("this controller belongs to a disabled patch: it takes no product.")

    def stats(self) -> dict:
        out = super().stats()
        out.update(enabled=False, visited_fraction=None)
        return out


def disabled_controller(config=None, **overrides) -> DisabledController:
    """A :class:`DisabledController` with the configuration a patch would have used (checked
    as it would be: a bad field still raises)."""
    if isinstance(config, RSCController):
        if overrides:
            raise TypeError("pass either an RSCController or RSCConfig fields, not both.")
        return DisabledController(config.config)
    return DisabledController(config, **overrides)

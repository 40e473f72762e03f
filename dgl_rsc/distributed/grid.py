"""The process grid of CAGNET's 1.5D algorithm: ``P`` ranks as ``P / c`` row blocks times ``c``
replicas.

Rank ``r = i * c + k`` holds row block ``i`` (its rows of ``A``, ``X`` and ``Y``) as replica
``k``. The ``c`` ranks of block ``i`` are its *replica group*; the ranks with the same ``k``
form *process column* ``k``. Replica ``k`` of every block handles the column blocks ``j`` with
``j % c == k`` (about ``P / c**2`` of them), so the halo messages of a product travel only
inside a process column, and the replica of block ``j`` that sends ``X_j``'s rows (and adds
their gradients) is replica ``j % c``. ``c = 1`` is the 1D layout: one rank per block.

See ``SPEC-15D`` in the project's tools (the scheme the cost model follows) and
:mod:`dgl_rsc.distributed.block15d` for the local graph that uses this grid.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["ProcessGrid", "grid_problem", "valid_replications"]


def valid_replications(world_size: int) -> list[int]:
    """The replications ``c`` a run of ``world_size`` processes can use: ``c`` divides ``P``
    and ``c * c <= P`` (every replica handles at least one column block).

    Example:
        >>> valid_replications(16)
        [1, 2, 4]
    """
    p = int(world_size)
    return [c for c in range(1, math.isqrt(p) + 1) if p % c == 0]


def grid_problem(world_size: int, replication: int) -> str:
    """Why ``replication`` cannot lay out ``world_size`` processes, or ``""`` when it can.

    Example:
        >>> grid_problem(4, 3)
        'distributed.replication=3 does not divide the 4 processes; use one of 1, 2'
        >>> grid_problem(4, 2)
        ''
    """
    p, c = int(world_size), int(replication)
    ok = ", ".join(map(str, valid_replications(p)))
    if c < 1 or p % c:
        return f"distributed.replication={c} does not divide the {p} processes; use one of {ok}"
    if c * c > p:
        return (
            f"distributed.replication={c} at {p} processes leaves {p // c} row block(s) for "
            f"{c} replicas, so some replica would handle no column block (1.5D needs c * c <= "
            f"P); use one of {ok}, or more processes"
        )
    return ""


@dataclasses.dataclass(frozen=True)
class ProcessGrid:
    """``world_size`` ranks laid out as ``world_size / replication`` blocks of ``replication``.

    Raises:
        ValueError: ``replication`` does not divide ``world_size`` (:func:`grid_problem`'s
            first case; the second, ``c * c > P``, is the launcher's to refuse).

    Example:
        >>> g = ProcessGrid(4, 2)
        >>> g.blocks, g.block_of(3), g.replica_of(3), g.rank_of(1, 0)
        (2, 1, 1, 2)
        >>> g.replica_group(1), g.column(0), g.column_blocks(1)
        ([2, 3], [0, 2], [1])
    """

    world_size: int
    replication: int = 1

    def __post_init__(self):
        p, c = int(self.world_size), int(self.replication)
        if p < 1 or c < 1 or p % c:
            raise ValueError(grid_problem(p, c) + ".")

    @property
    def blocks(self) -> int:
        """``q = P / c`` row blocks (graph parts)."""
        return self.world_size // self.replication

    def block_of(self, rank: int) -> int:
        return int(rank) // self.replication

    def replica_of(self, rank: int) -> int:
        return int(rank) % self.replication

    def rank_of(self, block: int, replica: int) -> int:
        return int(block) * self.replication + int(replica)

    def replica_group(self, block: int) -> list[int]:
        """The ``c`` ranks holding ``block``, replica 0 first."""
        return [self.rank_of(block, k) for k in range(self.replication)]

    def column(self, replica: int) -> list[int]:
        """Process column ``replica``: that replica of every block, block 0 first."""
        return [self.rank_of(i, replica) for i in range(self.blocks)]

    def column_blocks(self, replica: int) -> list[int]:
        """The column blocks ``j`` that ``replica`` handles (``j % c == replica``)."""
        return [j for j in range(self.blocks) if j % self.replication == replica]

    def handler(self, block: int) -> int:
        """The replica of every block that handles column block ``block``; of ``block``'s own
        replicas, the one that sends its rows and adds their gradients."""
        return int(block) % self.replication

    def describe(self, rank: int) -> dict:
        """Plain numbers for a report: the grid and ``rank``'s place in it."""
        return {"blocks": self.blocks, "replication": self.replication,
                "block": self.block_of(rank), "replica": self.replica_of(rank)}  # fmt: skip

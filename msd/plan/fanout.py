"""The relay tree of hierarchical fan-out: which Constructor a payload goes to next.

With ``n`` Constructors and fan-out ``f``, Constructors ``0 .. f-1`` are the roots and
Constructor ``i >= f`` hangs under ``i // f - 1``: each has at most ``f`` children and the tree
is about ``log_f n`` deep. A loader sends a sample meant for Constructor ``d`` to ``d``'s root
(so it talks to at most ``f`` Constructors, however many nodes there are); each Constructor on
the way passes it to its child above ``d``. With ``n <= f``, or no fan-out (``None``), every
Constructor is a root: loaders send straight to each (direct transfer).

The numbers are the Constructors' indices in the Planner's ``Welcome``. Which path a sample
takes changes no byte of any batch: a Constructor builds from what its plan names, whoever
brought it.
"""

from __future__ import annotations

from collections.abc import Iterable


class Tree:
    def __init__(self, constructors: int, fanout: int | None) -> None:
        assert constructors >= 0 and (fanout is None or fanout >= 1)
        self.size = constructors
        self.fanout = max(1, constructors) if fanout is None else fanout
        self._paths = [self._path(c) for c in range(constructors)]

    @property
    def relays(self) -> bool:
        """Some payloads travel through another Constructor (more nodes than the fan-out)."""
        return self.size > self.fanout

    def parent(self, c: int) -> int | None:
        return None if c < self.fanout else c // self.fanout - 1

    def children(self, c: int) -> range:
        first = (c + 1) * self.fanout
        return range(min(first, self.size), min(first + self.fanout, self.size))

    def path(self, dest: int) -> list[int]:
        """``dest``'s root first, then each Constructor down to ``dest``."""
        return self._paths[dest]

    def _path(self, dest: int) -> list[int]:
        path = [dest]
        while (up := self.parent(path[-1])) is not None:
            path.append(up)
        return path[::-1]

    def entry(self, dest: int) -> int:
        """Where a loader sends a sample meant for ``dest``."""
        return self.path(dest)[0]

    def next_hop(self, at: int, dest: int) -> int | None:
        """Where Constructor ``at`` passes a sample meant for ``dest``: ``dest`` itself when
        it is ``at`` or a child; None when ``dest`` is not below ``at`` (misrouted)."""
        path = self.path(dest)
        if at not in path:
            return None
        return path[min(path.index(at) + 1, len(path) - 1)]

    def by_entry(
        self, entries: Iterable[tuple[int, int, int]]
    ) -> dict[int, list[tuple[int, int, int]]]:
        """A loader's routed ``(source, gpos, dest)`` samples by the Constructor it sends
        each to, in the order given."""
        grouped: dict[int, list[tuple[int, int, int]]] = {}
        for entry in entries:
            grouped.setdefault(self.entry(entry[2]), []).append(entry)
        return grouped

    def depth(self) -> int:
        """Hops from a loader to the furthest Constructor."""
        return max((len(self.path(c)) for c in range(self.size)), default=0)

"""A node of the prefix cache's radix tree (`prefix_cache.py`): a run of cache units whose keys
it views in a request's key tuple (`src[start:end]`, no copy), and the two helpers that compare
and re-point those views."""

from __future__ import annotations

from presched.sim.seq import Seq


class Node:
    __slots__ = ("src", "start", "end", "ub", "parent", "children", "ref", "stamp", "owner", "dups",
                 "spares")  # fmt: skip

    def __init__(
        self, src: tuple[int, ...], start: int, end: int, ub: int, parent: "Node | None", ref: int
    ) -> None:  # fmt: skip
        self.src, self.start, self.end = src, start, end  # its unit keys: src[start:end]
        self.ub = ub  # blocks per unit
        self.parent = parent
        self.children: dict[int, Node] = {}  # by the child's first key
        self.ref = ref  # requests holding this node (a holder holds every ancestor too)
        self.stamp = 0  # when its reference count last dropped to 0 (LRU)
        self.owner: Seq | None = None  # the request that appends to it lazily (module doc)
        self.dups: list[Seq] | None = None  # holders with a copy of their own (they computed
        # these units after another request had cached them), oldest first; the others share
        # the first copy, which is free (cached, evictable) when only these hold the node
        self.spares: list[int] | None = None  # stamps of more free copies (released own ones)

    @property
    def blocks(self) -> int:
        return (self.end - self.start) * self.ub

    @property
    def keys(self) -> list[int]:
        return list(self.src[self.start : self.end])


def common(node: Node, keys: tuple[int, ...], i: int, j: int) -> int:
    """Length of the common start of `node`'s keys and `keys[i:j]` (C-level slice compares,
    binary search; slices no longer than the node's run)."""
    src, a = node.src, node.start
    n = min(node.end - a, j - i)
    if (src is keys and a == i) or src[a : a + n] == keys[i : i + n]:
        return n
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if src[a : a + mid] == keys[i : i + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def view(node: Node, keys: tuple[int, ...], i: int, end: int) -> None:
    """Make `node`, the last node of a path that spells `keys[:i]`, view `keys` up to `end`."""
    n = node.end - node.start
    node.src, node.start, node.end = keys, i - n, end

"""Generalization hierarchies as leaf-code intervals.

Leaves are numbered depth-first, so every node of the tree covers one contiguous range of leaf codes
``[lo, hi]``. A set of values then generalizes to the lowest common ancestor of its smallest and largest code,
and the categorical normalized certainty penalty ``(leaves(node) - 1) / (leaves(root) - 1)`` equals
``(hi - lo) / (n_leaves - 1)``: the same formula as a numeric attribute (Xu et al., KDD 2006; CASTLE, ICDE 2008).
This is what lets the engine treat every quasi-identifier as an interval and stay vectorized.

>>> h = Hierarchy.from_nested({"*": {"Rail": ["A", "B"], "Bus": ["1", "2", "3"]}})
>>> h.code("B"), h.n_leaves
(1, 5)
>>> h.generalize(0, 1)
(0, 1, 'Rail')
>>> h.generalize(1, 2)
(0, 4, '*')
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import networkx as nx
import numpy as np


class Hierarchy:
    """A generalization tree over categorical values (leaves), with depth-first leaf codes."""

    def __init__(self, graph: nx.DiGraph, root: str, name: str = ""):
        if not nx.is_arborescence(graph):
            raise ValueError(f"hierarchy {name!r}: not a tree (every label must be unique and have one parent)")
        self.name = name
        self.root = root
        self.graph = graph
        leaves: list[str] = []
        ranges: dict[str, tuple[int, int]] = {}
        depth: dict[str, int] = {root: 0}
        # Iterative DFS in child insertion order so codes follow the file's order.
        stack = [(root, False)]
        while stack:
            node, done = stack.pop()
            children = list(graph.successors(node))
            if done:
                ranges[node] = (ranges[children[0]][0], ranges[children[-1]][1])
                continue
            if not children:
                ranges[node] = (len(leaves), len(leaves))
                leaves.append(node)
                continue
            stack.append((node, True))
            for child in reversed(children):
                depth[child] = depth[node] + 1
                stack.append((child, False))
        self.leaves = leaves
        self.n_leaves = len(leaves)
        self.leaf_code = {leaf: i for i, leaf in enumerate(leaves)}
        self._range = ranges
        self._depth = depth
        # Lowest common ancestor lookup by (lo, hi) range: nodes sorted by span so the first covering one wins.
        nodes = sorted(ranges, key=lambda n: ranges[n][1] - ranges[n][0])
        self._node_lo = np.array([ranges[n][0] for n in nodes])
        self._node_hi = np.array([ranges[n][1] for n in nodes])
        self._node_label = nodes
        self._lca_cache: dict[tuple[int, int], tuple[int, int, str]] = {}

    # -- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_nested(cls, tree: dict, name: str = "") -> "Hierarchy":
        """From ``{"root": {"child": {...} | [leaf, ...]}}`` (docs/contracts.md section 3)."""
        if not isinstance(tree, dict) or len(tree) != 1:
            raise ValueError(f"hierarchy {name!r}: 'tree' must be an object with exactly one root")
        graph = nx.DiGraph()
        root = next(iter(tree))

        def add(parent: str, sub) -> None:
            items = sub.items() if isinstance(sub, dict) else ((leaf, None) for leaf in sub)
            for label, children in items:
                label = str(label)
                if label in graph:
                    raise ValueError(f"hierarchy {name!r}: label {label!r} appears twice")
                graph.add_edge(parent, label)
                if children is not None:
                    add(label, children)

        graph.add_node(str(root))
        add(str(root), tree[root])
        return cls(graph, str(root), name)

    @classmethod
    def from_json(cls, path: str | Path) -> "Hierarchy":
        data = json.loads(Path(path).read_text())
        if "tree" not in data:
            raise ValueError(f"hierarchy file {path}: missing key 'tree'")
        return cls.from_nested(data["tree"], data.get("name", Path(path).stem))

    @classmethod
    def from_arx_csv(cls, path: str | Path, delimiter: str = ";") -> "Hierarchy":
        """ARX format: one row per value, columns from the value up to the root ('*')."""
        graph = nx.DiGraph()
        root = None
        with open(path, newline="") as fh:
            for row in csv.reader(fh, delimiter=delimiter):
                row = [c for c in row if c != ""]
                if not row:
                    continue
                path_labels = row
                root = path_labels[-1] if root is None else root
                for child, parent in zip(path_labels, path_labels[1:]):
                    if child in graph and next(iter(graph.predecessors(child)), parent) != parent:
                        raise ValueError(f"ARX hierarchy {path}: {child!r} has two parents")
                    graph.add_edge(parent, child)
        if root is None:
            raise ValueError(f"ARX hierarchy {path}: empty")
        return cls(graph, root, Path(path).stem)

    @classmethod
    def flat(cls, values: list[str], name: str = "") -> "Hierarchy":
        """A one-level hierarchy: each value or everything ('*')."""
        return cls.from_nested({"*": list(values)}, name)

    # -- queries ------------------------------------------------------------------------------------------
    def code(self, value: str) -> int:
        return self.leaf_code[value]

    def codes(self, values) -> np.ndarray:
        """Leaf codes of values; unknown values get -1 (the caller rejects them)."""
        get = self.leaf_code.get
        return np.fromiter((get(v, -1) if v is not None else -1 for v in values), dtype=np.int64)

    def node_range(self, label: str) -> tuple[int, int]:
        return self._range[label]

    def label_of_leaf(self, code: int) -> str:
        return self.leaves[code]

    def depth(self, label: str) -> int:
        return self._depth[label]

    def ancestors(self, label: str) -> list[str]:
        return list(nx.ancestors(self.graph, label))

    def generalize(self, lo: int, hi: int) -> tuple[int, int, str]:
        """Lowest common ancestor of leaf codes lo..hi: (node_lo, node_hi, label)."""
        key = (int(lo), int(hi))
        hit = self._lca_cache.get(key)
        if hit is None:
            idx = int(np.argmax((self._node_lo <= lo) & (self._node_hi >= hi)))
            hit = (int(self._node_lo[idx]), int(self._node_hi[idx]), self._node_label[idx])
            self._lca_cache[key] = hit
        return hit

    def to_nested(self) -> dict:
        def build(node):
            children = list(self.graph.successors(node))
            if all(self.graph.out_degree(c) == 0 for c in children):
                return [str(c) for c in children]
            return {c: (build(c) if self.graph.out_degree(c) else []) for c in children}
        return {self.root: build(self.root)}

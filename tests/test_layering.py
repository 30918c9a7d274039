"""The floors of the house: every import inside ``flowrl`` points down, and no two packages import each other.

Walked with ``ast`` over every module of ``flowrl/`` (with ``rewards/`` and ``callbacks/``, installed as
``flowrl.rewards`` and ``flowrl.callbacks``), imports inside functions included. A package (or a top-level module)
of ``flowrl`` is one unit; the units stand on floors, from the bottom:

1. **foundations**: ``advantages``, ``losses``, ``sampling`` (pure tensor maths) and the small utilities
   ``digit_canvas``, ``model_paths``, ``output_dirs``, ``config_nodes``, with the package's own ``__init__``;
2. **rewards**: reward models as callbacks, usable in any Lightning project (they read a canvas or a model path);
3. **prompts**: ``prompt_records`` and ``data`` (records, conditioning images, the group sampler);
4. **policies**: the diffusers adapters (they turn images into pixels with a rewards helper);
5. **checkpoints**: paths, the fit check, atomic and sharded saves, the loading that export and evaluate share:
   a method is handed in (its class, or its class path), never imported;
6. **training**: the components a method calls (PPO update, adapter steps);
7. **strategies**: FSDP2, DeepSpeed and their checks; a method's ``uses_ppo`` is read off the object;
8. **callbacks**: reusable Lightning callbacks (EMA, sample grids, run header, image writer);
9. **methods**: the LightningModule loop and one module per algorithm;
10. **evaluation**: the evaluator, its metrics, sources and report (it generates through the methods);
11. **cli**: the commands (``fit``/``predict``, ``export``, ``evaluate``), at the top, and ``__main__``.

A unit may import any unit on its own floor or below; an import of a higher floor fails, naming the file, the line
and the arrow. Imports by name at run time (a config's ``class_path``, the CLI's table of subcommands) are the
caller's choice, not arrows of the code, and are not walked. The same order is written on the Concepts page
(``docs/concepts.md``, "Floors").
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, NamedTuple, Optional

ROOT = Path(__file__).resolve().parent.parent
#: the folders installed as ``flowrl`` packages (setuptools ``package-dir``)
PACKAGE_DIRS = {"flowrl": "flowrl", "rewards": "flowrl.rewards", "callbacks": "flowrl.callbacks"}
#: bottom first; see the module docstring
FLOORS: tuple[tuple[str, ...], ...] = (
    ("flowrl", "advantages", "losses", "sampling", "digit_canvas", "model_paths", "output_dirs", "config_nodes"),
    ("rewards",),
    ("prompt_records", "data"),
    ("policies",),
    ("checkpoints",),
    ("training",),
    ("strategies",),
    ("callbacks",),
    ("methods",),
    ("evaluation",),
    ("cli", "__main__"),
)
FLOOR = {unit: level for level, units in enumerate(FLOORS) for unit in units}


class Arrow(NamedTuple):
    """One import of ``target`` (a unit) by ``source`` (a unit), at ``where`` (``path:line``)."""

    source: str
    target: str
    where: str


def unit_of(module: str) -> Optional[str]:
    """The unit a dotted module name belongs to (None: not flowrl).

    >>> unit_of("flowrl.checkpoints.fit"), unit_of("flowrl"), unit_of("flowrl.data"), unit_of("torch.nn")
    ('checkpoints', 'flowrl', 'data', None)
    """
    parts = module.split(".")
    if parts[0] != "flowrl":
        return None
    return parts[1] if len(parts) > 1 else "flowrl"


def modules(root: Path = ROOT) -> Iterator[tuple[Path, str]]:
    """``(file, dotted module name)`` of every module of the installed ``flowrl`` packages under ``root``."""
    for folder, package in PACKAGE_DIRS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            yield path, ".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])


def imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """``(dotted name, line)`` of every import in ``tree`` (at any depth), relative ones resolved against
    ``module``; ``from flowrl import x`` names ``flowrl.x``.

    >>> list(imported(ast.parse("def f():\\n    from flowrl import methods\\n    from .paths import x"),
    ...               "flowrl.checkpoints.fit", False))
    [('flowrl.methods', 2), ('flowrl.checkpoints.paths', 3)]
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            if base == "flowrl":
                yield from ((f"flowrl.{alias.name}", node.lineno) for alias in node.names)
            else:
                yield base, node.lineno


def arrows(root: Path = ROOT) -> list[Arrow]:
    """Every import from one unit of ``flowrl`` into another, with where it is written."""
    found = []
    for path, module in modules(root):
        source = unit_of(module)
        for name, line in imported(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            target = unit_of(name)
            if target is not None and target != source:
                found.append(Arrow(source, target, f"{path.relative_to(root)}:{line}"))
    return found


def unplaced(found: list[Arrow], root: Path = ROOT) -> list[str]:
    """The units with no floor (a new package or top-level module must be given one)."""
    units = {unit_of(module) for _, module in modules(root)} | {a.target for a in found}
    return sorted(u for u in units if u not in FLOOR)


def upward(found: list[Arrow]) -> list[str]:
    """One line per import of a higher floor by a lower one.

    >>> upward([Arrow("checkpoints", "methods", "flowrl/checkpoints/fit.py:28")])
    ['flowrl/checkpoints/fit.py:28 imports flowrl.methods: checkpoints (floor 5) -> methods (floor 9) points up']
    """
    return [f"{a.where} imports flowrl.{a.target}: {a.source} (floor {FLOOR[a.source] + 1}) -> {a.target} (floor "
            f"{FLOOR[a.target] + 1}) points up" for a in found
            if a.source in FLOOR and a.target in FLOOR and FLOOR[a.source] < FLOOR[a.target]]


def cycle(found: list[Arrow]) -> Optional[list[Arrow]]:
    """The arrows of one import cycle between units (None: there is none).

    >>> [a.where for a in cycle([Arrow("a", "b", "a.py:1"), Arrow("b", "c", "b.py:2"), Arrow("c", "a", "c.py:3")])]
    ['a.py:1', 'b.py:2', 'c.py:3']
    >>> cycle([Arrow("a", "b", "a.py:1"), Arrow("a", "c", "a.py:2"), Arrow("b", "c", "b.py:3")]) is None
    True
    """
    first: dict[tuple[str, str], Arrow] = {}
    for a in found:
        first.setdefault((a.source, a.target), a)
    out: dict[str, list[str]] = {}
    for source, target in first:
        out.setdefault(source, []).append(target)
    done: set[str] = set()

    def walk(unit: str, path: list[str]) -> Optional[list[str]]:
        if unit in path:
            return path[path.index(unit):] + [unit]
        if unit in done:
            return None
        for target in sorted(out.get(unit, ())):
            if (loop := walk(target, [*path, unit])) is not None:
                return loop
        done.add(unit)
        return None

    for start in sorted(out):
        if (loop := walk(start, [])) is not None:
            return [first[(a, b)] for a, b in zip(loop, loop[1:])]
    return None


def test_every_unit_of_flowrl_stands_on_a_floor():
    assert not (missing := unplaced(arrows())), (
        f"no floor for {', '.join(missing)}: add each to FLOORS in tests/test_layering.py (and to the Floors list "
        "in docs/concepts.md), above every unit it imports")


def test_no_import_points_to_a_higher_floor():
    assert not (wrong := upward(arrows())), (
        "imports from a lower floor to a higher one (pass the object or a name instead, or move the code up):\n  "
        + "\n  ".join(wrong))


def test_no_two_units_import_each_other_even_through_others():
    loop = cycle(arrows())
    assert loop is None, ("an import cycle between the packages of flowrl:\n  "
                          + "\n  ".join(f"{a.where}: {a.source} -> {a.target}" for a in loop))

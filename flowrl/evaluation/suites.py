"""Prompt suites: the prompts an evaluation draws, each with an optional category and its whole record.

A suite is a named suite shipped with flowrl (``--suite digits_val``) or one or several files:

- ``.txt``: one prompt per line (the format of T2I-CompBench's lists, e.g. ``color_val.txt``);
- ``.jsonl``: one object per line with ``"prompt"`` and optionally ``"category"`` (GenEval's
  ``evaluation_metadata.jsonl``, whose ``"tag"`` is read as the category; every other key, such as GenEval's
  ``"include"``, is kept in the record that rewards receive as ``metadata["suite"]``).

With several files, a prompt without a category of its own takes its file's name (``color_val``), so T2I-CompBench's
per-category lists give a per-category breakdown. Prompts are identified by their position in the suite, never by
their text, so a suite may repeat a prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from flowrl.digit_canvas import parse_prompt

NAMED = Path(__file__).resolve().parent / "suites"
SUFFIXES = (".txt", ".jsonl")


@dataclass(frozen=True)
class Suite:
    """``prompts [P]``, ``categories [P]`` (None: no category) and each prompt's ``records [P]`` (its JSONL object,
    or ``{"prompt": ...}``)."""

    name: str
    prompts: list[str]
    categories: list[Optional[str]]
    records: list[dict]

    def __len__(self) -> int:
        return len(self.prompts)


def named_suites() -> list[str]:
    """The suites shipped with flowrl.

    >>> "digits_val" in named_suites()
    True
    """
    return sorted(p.stem for p in NAMED.glob("*.jsonl"))


def is_named(source: str) -> bool:
    """A name (no folder, no suffix) rather than a file.

    >>> is_named("digits_val"), is_named("prompts/geneval.jsonl"), is_named("color_val.txt")
    (True, False, False)
    """
    return "/" not in source and Path(source).suffix not in SUFFIXES


def read_records(path: Path) -> tuple[list[dict], list[str]]:
    """The records of a ``.txt`` or ``.jsonl`` file and the problems found in it (each naming the line)."""
    if path.suffix not in SUFFIXES:
        return [], [f"--suite {path}: unsupported suffix {path.suffix!r}; give a .txt (one prompt per line) or a "
                    ".jsonl ({\"prompt\": ..., \"category\": ...} per line) file, or a named suite"]
    if not path.is_file():
        return [], [f"--suite {path} does not exist (relative paths start at {Path.cwd()}); named suites: "
                    f"{', '.join(named_suites())}"]
    records, problems = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        if path.suffix == ".txt":
            records.append({"prompt": line.strip()})
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            problems.append(f"--suite {path}, line {number}: not JSON ({err.msg}); each line must be one object "
                            "such as {\"prompt\": \"red 3 and blue 7\", \"category\": \"colours\"}")
            continue
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"].strip():
            problems.append(f"--suite {path}, line {number}: needs a non-empty \"prompt\" string")
            continue
        category = record.get("category", record.get("tag"))
        if category is not None and not isinstance(category, str):
            problems.append(f"--suite {path}, line {number}: \"category\" must be a string, got {category!r}")
            continue
        records.append(record)
    if not records and not problems:
        problems.append(f"--suite {path} holds no prompts")
    return records, problems


def load_suite(sources: list[str]) -> tuple[Optional[Suite], list[str]]:
    """The suite of ``sources`` (one named suite, or files) and every problem with them, read without any model.

    >>> suite, problems = load_suite(["digits_val"])
    >>> len(suite), suite.categories[0], problems
    (128, 'two digits, two colours', [])
    >>> print(*load_suite(["no_such_suite"])[1])  # doctest: +ELLIPSIS
    --suite no_such_suite: no suite of that name; named suites: digits_val; or give a .txt/.jsonl file ...
    """
    named = [s for s in sources if is_named(s)]
    if named and len(sources) > 1:
        return None, [f"--suite {' '.join(sources)}: a named suite ({named[0]}) stands alone; give one name, or "
                      "only files"]
    if named and named[0] not in named_suites():
        return None, [f"--suite {named[0]}: no suite of that name; named suites: {', '.join(named_suites())}; or give "
                      "a .txt/.jsonl file (relative paths need their suffix)"]
    paths = [NAMED / f"{named[0]}.jsonl"] if named else [Path(s).expanduser() for s in sources]
    records, categories, problems = [], [], []
    for path in paths:
        found, wrong = read_records(path)
        problems += wrong
        for record in found:
            own = record.get("category", record.get("tag"))
            records.append(record)
            categories.append(own if own is not None else (path.stem if len(paths) > 1 else None))
    if problems:
        return None, problems
    name = named[0] if named else "+".join(p.stem for p in paths)
    return Suite(name, [r["prompt"] for r in records], categories, records), []


def digit_category(prompt: str) -> str:
    """The category of a digit-canvas prompt in the ``digits_val`` suite: what makes it hard.

    >>> [digit_category(p) for p in ["red 3 and blue 3", "red 3 and red 7", "red 3 and blue 7"]]
    ['one digit twice', 'two digits, one colour', 'two digits, two colours']
    """
    spec = parse_prompt(prompt)
    if spec.left_digit == spec.right_digit:
        return "one digit twice"
    return "two digits, one colour" if spec.left_color == spec.right_color else "two digits, two colours"


def digit_suite(prompts: list[str]) -> list[dict]:
    """The records of the ``digits_val`` suite for the validation prompts (``scripts/make_digit_suite.py``)."""
    return [{"prompt": p, "category": digit_category(p)} for p in prompts]


def grid_prompts(categories: list[Optional[str]], count: int) -> list[int]:
    """``count`` prompt indices for the report's image grid: the categories in turn (in order of first appearance),
    each giving its next prompt in suite order, so every category is shown; without categories, the first prompts.

    >>> grid_prompts(["a", "a", "b", "a", "c"], 4), grid_prompts([None] * 5, 2)
    ([0, 2, 4, 1], [0, 1])
    """
    queues: dict[Optional[str], list[int]] = {}
    for index, category in enumerate(categories):
        queues.setdefault(category, []).append(index)
    chosen: list[int] = []
    while len(chosen) < min(count, len(categories)):
        for queue in queues.values():
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return chosen

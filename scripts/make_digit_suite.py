"""Writes ``flowrl/evaluation/suites/digits_val.jsonl``, the ``digits_val`` suite of ``python -m flowrl evaluate``: the
quickstart's 128 held-out prompts (``configs/prompts/digits_val.txt``), each with its category
(:func:`flowrl.evaluation.suites.digit_category`: one digit twice, two digits of one colour, two digits of two colours).

    python scripts/make_digit_suite.py

``tests/evaluation/test_suites.py`` checks that the shipped file is this script's output.
"""

import json
from pathlib import Path

from flowrl.data import load_prompts
from flowrl.evaluation.suites import NAMED, digit_suite

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    records = digit_suite(load_prompts(str(ROOT / "configs/prompts/digits_val.txt")))
    out = NAMED / "digits_val.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"{out}: {len(records)} prompts")


if __name__ == "__main__":
    main()

"""Prompt suites: the shipped ``digits_val`` suite is what its script derives from the validation prompts, GenEval's
metadata file and T2I-CompBench's per-category lists read with their categories, and a bad file is refused with the
line and the fix."""

import json
from pathlib import Path

from flowrl.data import load_prompts
from flowrl.evaluation.suites import NAMED, digit_suite, load_suite

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_digit_suite_is_the_scripts_output():
    prompts = load_prompts(str(ROOT / "configs/prompts/digits_val.txt"))
    shipped = [json.loads(line) for line in (NAMED / "digits_val.jsonl").read_text().splitlines()]
    assert shipped == digit_suite(prompts)
    suite, problems = load_suite(["digits_val"])
    assert not problems and suite.prompts == prompts
    counts = {c: suite.categories.count(c) for c in set(suite.categories)}
    # by hand from the prompts: 10 name one digit twice, 42 two digits of one colour, 76 the rest
    assert counts == {"one digit twice": 10, "two digits, one colour": 42, "two digits, two colours": 76}


def test_geneval_metadata_reads_its_tag_as_the_category_and_keeps_the_record(tmp_path):
    lines = [{"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"},
             {"tag": "counting", "include": [{"class": "cat", "count": 2}], "prompt": "a photo of two cats"},
             {"prompt": "a red cube", "category": "colors"}]
    file = tmp_path / "evaluation_metadata.jsonl"
    file.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    suite, problems = load_suite([str(file)])
    assert not problems
    assert suite.categories == ["single_object", "counting", "colors"]
    assert suite.records[1]["include"] == [{"class": "cat", "count": 2}]  # what a detector reward reads


def test_t2i_compbench_lists_take_their_file_names_as_categories(tmp_path):
    (tmp_path / "color_val.txt").write_text("a green bench and a red car\na blue bowl\n")
    (tmp_path / "spatial_val.txt").write_text("a cat on the left of a dog\n")
    suite, problems = load_suite([str(tmp_path / "color_val.txt"), str(tmp_path / "spatial_val.txt")])
    assert not problems and len(suite) == 3
    assert suite.categories == ["color_val", "color_val", "spatial_val"]
    one, _ = load_suite([str(tmp_path / "color_val.txt")])
    assert one.categories == [None, None]  # one file: no breakdown of one category


def test_bad_files_are_refused_with_the_line_and_the_fix(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n{"text": "no prompt"}\n{"prompt": "x", "category": 3}\n')
    suite, problems = load_suite([str(bad)])
    assert suite is None and len(problems) == 3
    assert "line 2: not JSON" in problems[0] and "line 3: needs a non-empty \"prompt\"" in problems[1]
    assert "line 4: \"category\" must be a string" in problems[2]
    _, problems = load_suite([str(tmp_path / "missing.txt"), str(tmp_path / "prompts.csv")])
    assert "missing.txt does not exist" in problems[0] and "named suites: digits_val" in problems[0]
    assert "unsupported suffix '.csv'" in problems[1]
    _, problems = load_suite(["digits_val", str(bad)])
    assert "a named suite (digits_val) stands alone" in problems[0]

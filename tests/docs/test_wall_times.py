"""Every time a page of the docs or the README gives (``N s``, ``N min``, ``N minutes``, ``N h``...) is either a
measurement that ``docs/data/recorded.csv`` keeps, with its machine and load in the row's source, or a setting, a
limit or an estimate that says so. ``docs/data/quoted_times.csv`` names, for each phrase of a page that gives a time,
the recorded runs it quotes (or, with no run, why it is not a measurement). A page that gains a time, or a row whose
value changes, fails here until the page, the quote and the record agree (a pure text test: nothing runs)."""

import csv
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the README and the site's pages (docs/data/ holds the records, not pages)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("[!d]*/*.md"))]
SECONDS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "min": 60, "minute": 60, "minutes": 60,
           "h": 3600, "hour": 3600, "hours": 3600}
NUMBER = r"\d[\d,]*(?:\.\d+)?"
UNIT = r"(?:seconds?|sec|s|minutes?|min|hours?|h)"
#: a time: ``10 min 44 s``, ``1,223 s``, ``8-15 s`` (two times), ``~1.5 s``; not ``2 s^2`` nor ``[3, h, w]``
TIME = re.compile(rf"(?<![\w.^,\[])({NUMBER})(?:\s?(?:-|–|to)\s?({NUMBER}))?\s?({UNIT})\b(?!\^)"
                  rf"(?:\s({NUMBER})\s?(s)\b)?")
QUANTITY_SECONDS = {"wall_seconds": 1, "cpu_seconds": 1, "wall_minutes": 60}


def flat(path: Path) -> str:
    return " ".join(path.read_text().replace("**", "").split())  # bold and line wraps aside


def recorded() -> dict[str, list[float]]:
    """The times ``docs/data/recorded.csv`` keeps, in seconds, by run (a run may keep its wall and CPU time)."""
    out: dict[str, list[float]] = {}
    with open(ROOT / "docs/data/recorded.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["quantity"] in QUANTITY_SECONDS:
                out.setdefault(r["run"], []).append(float(r["value"]) * QUANTITY_SECONDS[r["quantity"]])
    return out


def quotes() -> list[dict[str, str]]:
    with open(ROOT / "docs/data/quoted_times.csv", newline="") as f:
        return list(csv.DictReader(f))


def times(text: str) -> list[tuple[int, str, float, float]]:
    """``(offset, as written, seconds, the precision written, in seconds)`` of every time in ``text``; a range gives
    both ends, ``10 min 44 s`` one time to the second."""
    out = []
    for m in TIME.finditer(text):
        unit = SECONDS[m[3]]
        if m[4]:  # N min M s
            out.append((m.start(), m[0], float(m[1].replace(",", "")) * unit + float(m[4]), 1.0))
            continue
        for number in filter(None, (m[1], m[2])):
            decimals = len(number.partition(".")[2])
            out.append((m.start(), m[0], float(number.replace(",", "")) * unit, unit * 10.0 ** -decimals))
    return out


def reads(seconds: float, precision: float, kept: list[float]) -> bool:
    """Whether one of the ``kept`` times, written to ``precision``, reads ``seconds`` (``about 11 minutes`` reads
    10.73 minutes; ``10 min 44 s`` reads 10.73 minutes too)."""
    return any(abs(value - seconds) <= precision / 2 + 1e-6 for value in kept)


def test_the_time_reader_reads_ranges_compounds_and_precision():
    found = times("took 1,223 s (20 min); a step 8-15 s; 10 min 44 s; ~1.5 s; over 2 s^2 at [3, h, w]")
    assert [(f[1], f[2], f[3]) for f in found] == [
        ("1,223 s", 1223.0, 1.0), ("20 min", 1200.0, 60.0), ("8-15 s", 8.0, 1.0), ("8-15 s", 15.0, 1.0),
        ("10 min 44 s", 644.0, 1.0), ("1.5 s", 1.5, 0.1)]
    kept = [10.73 * 60]  # 643.8 s
    assert reads(11 * 60, 60, kept) and reads(644, 1, kept) and not reads(10 * 60, 60, kept)
    assert not reads(643, 1, kept)


def test_every_time_on_the_pages_is_quoted_from_a_record_or_says_why_it_is_not_one():
    rows, unquoted = recorded(), []
    by_page: dict[str, list[dict[str, str]]] = {}
    for quote in quotes():
        by_page.setdefault(quote["page"], []).append(quote)
    for page in PAGES:
        text, name = flat(page), str(page.relative_to(ROOT))
        spans = [(text.find(q["phrase"]), q) for q in by_page.get(name, [])]
        for offset, written, _, _ in times(text):
            if not any(0 <= start <= offset < start + len(q["phrase"]) for start, q in spans):
                unquoted.append(f"{name}: {written!r} in '...{text[max(0, offset - 60):offset + 40]}...'")
    assert not unquoted, (
        "times no row of docs/data/quoted_times.csv quotes: add the measurement to docs/data/recorded.csv (quantity "
        "wall_seconds, wall_minutes or cpu_seconds; the run; the value; the source: command, machine, load, date or "
        "commit) and the page's phrase with the run to quoted_times.csv, or, where it is not a measurement, the "
        "phrase with why:\n" + "\n".join(unquoted))


def test_every_quote_is_on_its_page_and_reads_its_records():
    rows = recorded()
    for quote in quotes():
        page, phrase, runs = quote["page"], quote["phrase"], [r for r in quote["runs"].split(";") if r]
        assert phrase in flat(ROOT / page), (page, phrase, "the phrase is no longer on the page")
        if not runs:
            assert quote["not_measured"], (page, phrase, "a quote with no recorded run says why it is not one")
            continue
        missing = [run for run in runs if run not in rows]
        assert not missing, (page, phrase, f"runs not in docs/data/recorded.csv: {missing}")
        kept = [value for run in runs for value in rows[run]]
        for _, written, seconds, precision in times(phrase):
            assert reads(seconds, precision, kept), (page, phrase, written, f"recorded: {kept} s")

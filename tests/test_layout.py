"""Import boundaries (walked with ``ast``): pure maths imports neither Lightning nor diffusers; only policies
import diffusers."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PURE = ["flowrl/advantages", "flowrl/losses", "flowrl/sampling", "flowrl/digit_canvas.py"]


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def files(*parts: str) -> list[Path]:
    out = []
    for part in parts:
        p = ROOT / part
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def test_pure_modules_import_neither_lightning_nor_diffusers():
    for path in files(*PURE):
        assert not imported_roots(path) & {"lightning", "diffusers", "pytorch_lightning"}, path


def test_only_policies_import_diffusers():
    for path in files("flowrl", "rewards", "callbacks"):
        if "policies" in path.parts or "assets" in path.parts:
            continue
        assert "diffusers" not in imported_roots(path), path


def test_no_file_is_a_grab_bag():
    names = {p.stem for p in files("flowrl", "rewards", "callbacks")}
    assert not names & {"utils", "common", "misc", "helpers"}


def test_rewards_estimators_and_losses_import_without_diffusers_or_the_policies():
    # a fresh interpreter: this one has imported everything already
    import subprocess
    import sys

    code = ("import sys, flowrl.rewards, flowrl.advantages, flowrl.losses\n"
            "from flowrl.rewards import JpegCompressibility, FunctionReward, RewardSet\n"
            "import flowrl.rewards.jpeg, flowrl.rewards.digit_alignment\n"
            "print(sorted(m for m in ('diffusers', 'flowrl.policies', 'flowrl.methods') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"

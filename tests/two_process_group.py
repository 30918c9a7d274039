"""Every 2-process fit of the default suite's equality and resume checks on the tiny model and the tiny SD3,
Qwen-Image (1 and 2.1), FLUX.1 Kontext and Wan pipelines, and the 2-process ``evaluate``, in one launched process
group, built once a session.

A launched process pays the imports of Lightning, diffusers and transformers (seconds of CPU each, twice for 2 ranks),
far more than a tiny fit costs: so the 2-process fits of every module in :data:`MODULES` run one after another in one
process group (``tests/methods/fits_in_one_process.py``; the first fit starts the second rank, the later ones join
its group), and their 1-process references run once, in pytest's own process, before it. Each module declares its
fits with ``two_process_fits(folder, models) -> (one_process, two_processes)``, argument lists of ``python -m
flowrl`` writing under its ``folder`` (``models``: the tiny models' folders by name, see :func:`run_every_fit`); its
tests ask for the session fixture ``two_process_fits`` (``tests/conftest.py``), the folder that holds one sub-folder
per module, and carry :data:`GROUP` so that one xdist worker builds it (``--dist loadgroup``). A fit that fails ends
the group: every test that reads it fails with that fit's output."""

import importlib
import os
from pathlib import Path

import pytest
import torch

from tests.methods.fits_in_one_process import ROOT, run_in_one_process

#: the modules whose 2-process fits share the group, in the order they run
MODULES = ("tests.methods.test_two_ranks_equal_one", "tests.methods.test_likelihood_free_fsdp2",
           "tests.cli.test_fsdp2", "tests.policies.test_fsdp2_pipeline", "tests.policies.test_fsdp2_families",
           "tests.policies.test_fsdp2_editing", "tests.policies.test_wan_context_parallel_fit",
           "tests.policies.test_wan_fit", "tests.evaluation.test_ddp")
#: the file in ``<folder>/two_processes`` that keeps the group's output
OUTPUT = "output.txt"
#: the xdist group of every test that reads the fits
GROUP = pytest.mark.xdist_group("two_process_group")


def module_folder(folder: Path, module: str) -> Path:
    """Where ``module``'s fits write: ``folder/<its file's name>``."""
    return folder / module.rsplit(".", 1)[-1]


def run_every_fit(folder: Path, models: dict[str, str], modules: tuple[str, ...] = MODULES,
                  start_up: int = 600, seconds_per_fit: int = 60) -> Path:
    """The 1-process fits of every module of ``modules`` in this process (one torch thread, from the repository, as
    the launched ones run), then their 2-process fits in one launched process group, which fails (a hang) after
    ``start_up`` seconds and ``seconds_per_fit`` more per fit: a tiny fit takes seconds on 2 idle cores, a start-up
    several times more on a loaded machine. ``models``: the tiny models' folders by name (``tiny``, ``sd3``, ..., ``wan``: tests/conftest.py's
    ``TINY_MODELS``).
    Returns ``folder``."""
    from flowrl.cli import main

    ones, twos = [], []
    for name in modules:
        one, two = importlib.import_module(name).two_process_fits(module_folder(folder, name), models)
        ones, twos = ones + one, twos + two
    threads, cwd = torch.get_num_threads(), Path.cwd()
    torch.set_num_threads(1)
    os.chdir(ROOT)
    try:
        for args in ones:
            main(args)
    finally:
        torch.set_num_threads(threads)
        os.chdir(cwd)
    output = run_in_one_process(twos, folder / "two_processes", timeout=start_up + seconds_per_fit * len(twos))
    (folder / "two_processes" / OUTPUT).write_text(output)
    return folder


def output_of_the_group(folder: Path) -> str:
    """What both processes of the group printed (one stream), as :func:`run_every_fit` in ``folder`` kept it."""
    return (folder / "two_processes" / OUTPUT).read_text()

"""Every method on 2 CPU processes computes what 1 process computes: one test per strategy (DDP, FSDP2) over every
method, whose 2-process fits (both strategies') share one launched process group with the suite's other 2-process
equality and resume fits (``tests/two_process_group.py``), against 1-process fits run once for both strategies. Each
method keeps its own check: the same samples split over the ranks, the same per-sample rewards and advantages, the
same final weights, and what the method adds (DenseGRPO's calibrated noise scales, the tree methods' nodes, the
likelihood-free methods' extra adapters, ranks that hold different numbers of trained pairs, a NaN on one rank, each
rank holding half of a sharded denoiser). The methods' cases are in ``tests/methods/two_rank_cases.py``; this file
checks them under each strategy and adds FSDP2's (full fine-tuning, the sharding checks)."""

from pathlib import Path

import torch

from tests.cli.test_fit import fit_args, load_steps
from tests.methods.two_rank_cases import DDP_CASES, DDP_ONLY, SGD, flow_grpo
from tests.two_process_group import GROUP, module_folder

pytestmark = GROUP

DDP = ["--trainer.devices=2", "--trainer.strategy=ddp"]
FSDP2 = ["--trainer.devices=2", "--trainer.strategy=fsdp2"]


def check_every_method(cases: dict, folder: Path, strategy: str) -> None:
    """Each case ``name: (args(out, *extra), check(one_dir, two_dir))`` checked on its 1-process fit
    (``folder/name/one``) and its 2-process fit under ``strategy`` (``folder/name/<strategy>``); the failures of every
    method are reported together. A case may add a third item: the name of the case whose 1-process fit it shares, or
    None for a 2-process fit that needs no 1-process one."""
    failed = {}
    for name, (_, check, *rest) in cases.items():
        one = rest[0] if rest else name
        try:
            check(folder / (one or name) / "one", folder / name / strategy)
        except AssertionError as error:
            failed[name] = f"{type(error).__name__}: {error}"
    assert not failed, "\n".join(f"{name}: {why}" for name, why in failed.items())


def test_ddp_two_processes_equal_one_process_for_every_method(tiny_model_dir, two_process_fits):
    check_every_method({name: make(tiny_model_dir) for name, make in DDP_CASES.items()},
                       module_folder(two_process_fits, __name__), "ddp")


# full fine-tuning, one batch of two minibatches (two optimizer steps, the second from the sharded update of the
# first): the ranks' micro-batch counts differ, so the shorter rank pads (weight 0); clipping at 0.05 binds (a
# per-rank norm would clip differently); beta > 0 runs the sharded reference
FULL = ["--model.init_args.policy.init_args.lora=null", "--trainer.callbacks.full=true", "--model.init_args.beta=0.1",
        "--model.init_args.max_grad_norm=0.05", "--model.init_args.num_minibatches=2",
        "--model.init_args.check_ratio=true", "--model.init_args.recompute_log_probs=true"]


def assert_full_runs_equal(one_dir: Path, two_dir: Path) -> None:
    """Full fine-tuning: every step's advantages (matched by seed) and every final weight of the 2-process run equal
    the 1-process run's; the trained weights moved away from the frozen reference (the initial weights), by steps
    the clip bound limited."""
    one, two = load_steps(one_dir), load_steps(two_dir)
    for step in sorted({k.split("_")[0] for k in one}):
        ranks = [two[f"{step}_rank{r}"] for r in (0, 1)]
        seeds = torch.cat([r["seeds"] for r in ranks])
        torch.testing.assert_close(torch.cat([r["advantages"] for r in ranks])[seeds.argsort()],
                                   one[f"{step}_rank0"]["advantages"][one[f"{step}_rank0"]["seeds"].argsort()])
    assert one["step0_rank0"]["grad_norm"] > 0.05  # above the clip bound: the clipping acted
    w1, w2 = torch.load(one_dir / "dump/weights.pt"), torch.load(two_dir / "dump/weights.pt")
    assert w1.keys() == w2.keys() and all(torch.allclose(w1[k], w2[k], rtol=1e-4, atol=1e-7) for k in w1)
    trained = [k for k in w1 if k.startswith("denoiser.")]
    assert any(not torch.equal(w1[k], w1["reference_" + k]) for k in trained)
    assert all(torch.equal(w1["reference_" + k], w2["reference_" + k]) for k in trained)


def held_bytes(dump: Path, rank: int) -> dict[str, int]:
    return torch.load(dump / f"held_bytes_rank{rank}.pt")


def sharded(make):
    """``make``'s case with the checks every FSDP2 run adds: the logged gradient norm is the global one on every rank,
    and each rank holds about half of the denoiser (and of the reference): sharded, never a whole copy per rank."""
    def sharded_make(tiny_model_dir):
        args, check, *rest = make(tiny_model_dir)

        def sharded_check(one_dir, two_dir):
            check(one_dir, two_dir)
            one = load_steps(one_dir)
            for step, ranks in load_steps(two_dir).items():
                if "grad_norm" in ranks:
                    torch.testing.assert_close(ranks["grad_norm"], one[step[:-1] + "0"]["grad_norm"])
            whole = held_bytes(one_dir / "dump", 0)
            for rank in (0, 1):
                for name, size in held_bytes(two_dir / "dump", rank).items():
                    assert 0.4 * whole[name] < size < 0.6 * whole[name], (name, size, whole[name])

        return args, sharded_check, *rest
    return sharded_make


def full(tiny_model_dir):
    common = ["--trainer.max_steps=2", "--model.init_args.micro_batch_size=3", *SGD, *FULL]
    return lambda out, *extra: fit_args(tiny_model_dir, out, *common, *extra), assert_full_runs_equal


def full_reduce_every_micro_batch(tiny_model_dir):
    """Full fine-tuning with FSDP2's class and an option: gradients reduce-scattered after every micro-batch instead
    of accumulated unsharded (against the 1-process fit of ``full``)."""
    args, check = full(tiny_model_dir)
    reduce = ["--trainer.strategy=flowrl.strategies.FSDP2Strategy", "--trainer.strategy.reduce_every_micro_batch=true"]
    return lambda out, *extra: args(out, *extra, *(reduce if extra else [])), check, "full"


FSDP2_CASES = {name: sharded(make) for name, make in {
    "flow_grpo": flow_grpo,
    "full": full,
    "full_reduce_every_micro_batch": full_reduce_every_micro_batch,
    **{name: make for name, make in DDP_CASES.items() if name not in DDP_ONLY},
}.items()}


def test_fsdp2_two_processes_equal_one_process_for_every_method(tiny_model_dir, two_process_fits):
    check_every_method({name: make(tiny_model_dir) for name, make in FSDP2_CASES.items()},
                       module_folder(two_process_fits, __name__), "fsdp2")


STRATEGIES = {"ddp": (DDP_CASES, DDP), "fsdp2": (FSDP2_CASES, FSDP2)}


def two_process_fits(folder: Path, models: dict[str, str]) -> tuple[list[list[str]], list[list[str]]]:
    """Every case's 1-process fit (once for both strategies: a case of both builds the same arguments) and its
    2-process fit under each strategy (``tests/two_process_group.py``)."""
    ones, twos = {}, []
    for strategy, (cases, options) in STRATEGIES.items():
        for name, make in cases.items():
            args, _, *rest = make(models["tiny"])
            (folder / name).mkdir(parents=True, exist_ok=True)
            if not rest:
                ones.setdefault(name, args(folder / name / "one"))
            twos.append(args(folder / name / strategy, *options))
    return list(ones.values()), twos

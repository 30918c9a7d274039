"""Every method on 2 CPU processes computes what 1 process computes: one test per strategy (DDP, FSDP2) over every
method, whose 2-process fits (both strategies') share one launched process group with the suite's other 2-process
equality and resume fits (``tests/two_process_group.py``), against 1-process fits run once for both strategies. Each
method keeps its own check: the same samples split over the ranks, the same per-sample rewards and advantages, the
same final weights, and what the method adds (DenseGRPO's calibrated noise scales, the tree methods' nodes, the
likelihood-free methods' extra adapters, ranks that hold different numbers of trained pairs, a NaN on one rank, each
rank holding half of a sharded denoiser).

SGD at lr 1 without clipping throughout (where not said otherwise): the update is -lr * (gradient averaged over all
samples), so a rank missing an all-reduce would be off by O(1); Adam's first step (~lr * sign(g)) would amplify float
noise in near-zero gradient entries instead."""

from pathlib import Path

import torch

from tests.cli.test_fit import STEP_GAIN, assert_two_ranks_equal_one, fit_args, load_steps
from tests.methods import test_tp_grpo
from tests.methods.likelihood_free import shrunk
from tests.methods.test_method_layer import method_fit_args
from tests.methods.test_nonfinite import fit as nonfinite_fit
from tests.methods.test_tree_methods import tree_fit
from tests.two_process_group import GROUP, module_folder

pytestmark = GROUP

SGD = ["--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.lr=1.0"]
NO_CLIP = [*SGD, "--model.init_args.max_grad_norm=null"]
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


def plain(one: Path, two: Path) -> None:
    assert_two_ranks_equal_one(one, two)


def rewards_and_advantages(one: Path, two: Path) -> None:
    assert_two_ranks_equal_one(one, two, keys=("rewards", "advantages"))


def flow_grpo(tiny_model_dir):
    common = ["--trainer.max_steps=2", "--model.init_args.micro_batch_size=3", *NO_CLIP]
    return lambda out, *extra: fit_args(tiny_model_dir, out, *common, *extra), plain


def every_step(one_dir: Path, two_dir: Path) -> None:
    """Every step of the 2-process run (not only the first) has the 1-process run's rewards and advantages, matched
    by seed (a schedule over batches: MixGRPO's window, Flash's per-group step, GCPO's chunk draw), and the same final
    weights."""
    assert_two_ranks_equal_one(one_dir, two_dir)
    one, two = load_steps(one_dir), load_steps(two_dir)
    assert len(one) > 1 and len(two) == 2 * len(one)
    for step in sorted({k.split("_")[0] for k in one}):
        ranks, ref = [two[f"{step}_rank{r}"] for r in (0, 1)], one[f"{step}_rank0"]
        order = torch.cat([r["seeds"] for r in ranks]).argsort()
        for key in ("rewards", "advantages"):
            torch.testing.assert_close(torch.cat([r[key] for r in ranks])[order], ref[key][ref["seeds"].argsort()])


def step_credit(*options: str):
    """A step-credit option on fit_tiny.yaml, two batches: MixGRPO's, Flash-GRPO's and GCPO's draws are keyed by the
    seed, the batch and the group or sample, so each rank draws for its own rows what one process draws for them
    (the one-step gain draws nothing)."""
    def make(tiny_model_dir):
        common = ["--trainer.max_steps=2", "--model.init_args.micro_batch_size=2", *options, *NO_CLIP]
        return lambda out, *extra: fit_args(tiny_model_dir, out, *common, *extra), every_step
    return make


# the random window over [0, 3) of 4 steps; Flash's draw over 3 steps with the batch-mean weight (gathered); GCPO half
# of the chunks [1, 2] per sample, weighted by the latents' relative-L1 change (each rank's own latents)
MIX_GRPO = step_credit("--model.init_args.num_steps=4", "--model.init_args.sde_window=2",
                       "--model.init_args.window_strategy=random", "--model.init_args.window_range=[0, 3]")
FLASH_GRPO = step_credit("--model.init_args.flash_pool=[0, 1, 2]", "--model.init_args.flash_noise=true",
                         "--model.init_args.rectify=batch")
GCPO = step_credit("--model.init_args.loss=chunk_gspo", "--model.init_args.loss_options={chunks: [1, 2]}",
                   "--model.init_args.train_chunks=0.5", "--model.init_args.chunk_weighting=normalized",
                   "--model.init_args.timestep_fraction=1.0")

# the one-step gain credit: each rank scores its own rows' predictions x - sigma v, the gains normalised per (group,
# step) over the gathered batch
STEP_GAIN_CASE = step_credit(*STEP_GAIN)


def dense_grpo(tiny_model_dir):
    # calibration counts dR signs over the trajectories of every rank, and the per-(group, step) advantages use the
    # gathered rewards, so two processes calibrate the same psi and take the same SGD step as one
    brightness = ("{class_path: flowrl.rewards.FunctionReward, init_args: {function: "
                  "tests.rewards.reward_functions.brightness}}")

    def args(out, *extra):
        return ["fit", "--config", "configs/tiny_dense_grpo.yaml", f"--model.init_args.policy.init_args.model="
                f"{tiny_model_dir}", "--trainer.max_steps=1", "--trainer.logger=false",
                f"--trainer.default_root_dir={out}", f"--trainer.callbacks=[{brightness}, "
                "tests.cli.dump_outputs.DumpOutputs]", f"--trainer.callbacks.out={out}/dump",
                "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
                "--trainer.enable_checkpointing=false", "--data.prompts=[red 1 and blue 2, green 3 and red 4]",
                "--data.num_groups=2", "--data.group_size=4", "--model.init_args.num_steps=3",
                "--model.init_args.micro_batch_size=4", "--model.init_args.calibration.samples=8",
                "--model.init_args.calibration.iterations=2", "--model.init_args.calibration.eps1=1", *NO_CLIP, *extra]

    def check(one, two):
        psi = torch.load(one / "dump/noise_scales_rank0.pt")
        assert psi.shape == (3,)
        for rank in (0, 1):
            assert torch.allclose(torch.load(two / f"dump/noise_scales_rank{rank}.pt"), psi, atol=1e-6)
        assert assert_two_ranks_equal_one(one, two, keys=("rewards", "advantages"))["advantages"].abs().sum() > 0

    return args, check


def tp_grpo(tiny_model_dir):
    # turning points are balanced over the batch gathered from both ranks, so the advantages match one process
    # (with this seed and reward, balancing the two halves of the batch separately keeps other turning points)
    common = ["--trainer.max_steps=1", *NO_CLIP]
    return lambda out, *extra: test_tp_grpo.fit_args(tiny_model_dir, out, *common, *extra), rewards_and_advantages


def tree(method: str, *options: str):
    """A tree method: one tree per prompt; the 2-process rows matched to the 1-process ones by (seed, leaf node)."""
    def make(tiny_model_dir):
        common = [*options, "--trainer.max_steps=1", *NO_CLIP]

        def check(one_dir, two_dir):
            one = load_steps(one_dir)["step0_rank0"]
            ranks = [load_steps(two_dir)[f"step0_rank{r}"] for r in (0, 1)]
            key = lambda step: [(s, n) for s, n in zip(step["seeds"].tolist(), step["node_ids"][:, -1].tolist())]  # noqa
            both = {k: i for i, k in enumerate(key(ranks[0]) + key(ranks[1]))}
            order = torch.tensor([both[k] for k in key(one)])  # the 2-process rows in the 1-process order
            for name in ("rewards", "advantages"):
                joined = torch.cat([r[name] for r in ranks])[order]
                assert torch.allclose(joined.float(), one[name].float(), atol=1e-5), name
            assert one["advantages"].abs().sum() > 0
            w1, w2 = torch.load(one_dir / "dump" / "weights.pt"), torch.load(two_dir / "dump" / "weights.pt")
            assert all(torch.allclose(w1[k], w2[k], rtol=1e-4, atol=1e-7) for k in w1)

        return lambda out, *extra: tree_fit(tiny_model_dir, out, method, *common, *extra), check
    return make


def diffusion_nft(tiny_model_dir):
    # two minibatches whose rows the ranks hold in unequal shares: the all-reduced gradient must be the minibatch's
    # mean over every rank
    common = ["--trainer.max_steps=2", "--model.init_args.num_minibatches=2", "--model.init_args.micro_batch_size=3",
              *NO_CLIP]
    return (lambda out, *extra: shrunk("tiny_diffusion_nft.yaml", out, *common, *extra, model_dir=tiny_model_dir),
            plain)


def mean_shift_loss(config: str, *options: str):
    """Flow-DPPO or GRPO-Guard: two minibatches of unevenly held pairs, so the second is off-policy and the old means
    each rank replayed for its own rows enter the loss (DPPO's threshold 0: every outward pair is dropped)."""
    def make(tiny_model_dir):
        common = ["--trainer.max_steps=2", "--model.init_args.num_minibatches=2",
                  "--model.init_args.micro_batch_size=3", *options, *NO_CLIP]
        return lambda out, *extra: shrunk(config, out, *common, *extra, model_dir=tiny_model_dir), plain
    return make


def awm(tiny_model_dir):
    # as DiffusionNFT, with the old adapter's forward taken (two minibatches) and velocity_ema following
    common = ["--trainer.max_steps=2", "--model.init_args.num_minibatches=2", "--model.init_args.micro_batch_size=5",
              *NO_CLIP]
    return lambda out, *extra: shrunk("tiny_awm.yaml", out, *common, *extra, model_dir=tiny_model_dir), plain


def tdm_r1(tiny_model_dir):
    # the fake score and surrogate steps come before the generator's: a rank that missed an adapter's all-reduce
    # would be off by O(1)
    common = ["--trainer.max_steps=1", "--model.init_args.generator_init=null",
              "--model.init_args.adapter_optimizer_options={}", *NO_CLIP]

    def check(one, two):
        assert_two_ranks_equal_one(one, two)
        w1 = torch.load(one / "dump/weights.pt")
        for name in ("fake_score", "surrogate", "surrogate_old"):
            assert any(w.abs().sum() > 0 for k, w in w1.items() if f"lora_B.{name}." in k), name

    return lambda out, *extra: shrunk("tiny_tdm_r1.yaml", out, *common, *extra, model_dir=tiny_model_dir), check


def uneven_pairs(tiny_model_dir):
    # rows with a seed divisible by 3 train their first step only: the ranks hold different numbers of trained pairs
    common = ["--trainer.max_steps=2", "--model.init_args.micro_batch_size=2", "--model.init_args.num_minibatches=2",
              *NO_CLIP]

    def check(one, two):
        assert_two_ranks_equal_one(one, two)
        pairs = [torch.load(two / "dump" / f"pairs_rank{r}.pt") for r in (0, 1)]
        assert pairs[0] != pairs[1] and sum(pairs) == torch.load(one / "dump" / "pairs_rank0.pt")

    return (lambda out, *extra: method_fit_args(tiny_model_dir, out, "tests.methods.uneven.UnevenFlowGRPO", *common,
                                                *extra), check)


def nan_on_one_rank(tiny_model_dir):
    # rank 1's loss is NaN but its gradient is 0: only the shared decision keeps rank 0 from stepping alone (a
    # 2-process fit only)
    def args(out, *extra):
        return nonfinite_fit(tiny_model_dir, out, "--model.init_args.nan_batches=[0]", "--model.init_args.nan_ranks=[1]",
                             "--model.init_args.nan_in=loss_only", f"--model.init_args.dump_dir={out}/dump",
                             "--trainer.max_steps=1", *extra)

    def check(_, two):
        ranks = [torch.load(two / "dump" / f"rank{r}.pt") for r in (0, 1)]
        assert [r["batches"] for r in ranks] == [2, 2] and [r["global_step"] for r in ranks] == [1, 1]
        assert all(torch.equal(ranks[0]["weights"][n], w) for n, w in ranks[1]["weights"].items())

    return args, check, None


DDP_CASES = {
    "flow_grpo": flow_grpo,
    "dense_grpo": dense_grpo,
    "tp_grpo": tp_grpo,
    "tempflow_grpo": tree("flowrl.methods.TempFlowGRPO", "--model.init_args.branches=3"),
    "tree_rpo": tree("flowrl.methods.TreeRPO", "--model.init_args.window_size=2", "--model.init_args.window_start=1"),
    "branch_grpo": tree("flowrl.methods.BranchGRPO", "--model.init_args.split_steps=[0, 2]"),
    "g2rpo": tree("flowrl.methods.G2RPO", "--model.init_args.branches=2"),
    "diffusion_nft": diffusion_nft,
    "dppo": mean_shift_loss("tiny_dppo.yaml", "--model.init_args.loss_options={kl_threshold: 0.0}"),
    "grpo_guard": mean_shift_loss("tiny_grpo_guard.yaml", "--model.init_args.clip_range=1.0e-3"),
    "awm": awm,
    "tdm_r1": tdm_r1,
    "mix_grpo": MIX_GRPO,
    "gcpo": GCPO,
    "flash_grpo": FLASH_GRPO,
    "step_gain": STEP_GAIN_CASE,
    "uneven_pairs": uneven_pairs,
    "nan_on_one_rank": nan_on_one_rank,
}


def test_ddp_two_processes_equal_one_process_for_every_method(tiny_model_dir, two_process_fits):
    check_every_method({name: make(tiny_model_dir) for name, make in DDP_CASES.items()},
                       module_folder(two_process_fits, __name__), "ddp")


# full fine-tuning: two minibatches per batch: the ranks' micro-batch counts differ, so the shorter rank pads (weight
# 0); clipping at 0.05 binds (a per-rank norm would clip differently); beta > 0 runs the sharded reference
FULL = ["--model.init_args.policy.init_args.lora=null", "--trainer.callbacks.full=true", "--model.init_args.beta=0.1",
        "--model.init_args.max_grad_norm=0.05", "--model.init_args.num_minibatches=2", "--trainer.max_steps=4",
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
    "dense_grpo": dense_grpo,
    "tp_grpo": tp_grpo,
    "tempflow_grpo": DDP_CASES["tempflow_grpo"],
    "tree_rpo": DDP_CASES["tree_rpo"],
    "branch_grpo": DDP_CASES["branch_grpo"],
    "g2rpo": DDP_CASES["g2rpo"],
    "diffusion_nft": diffusion_nft,
    "dppo": DDP_CASES["dppo"],
    "grpo_guard": DDP_CASES["grpo_guard"],
    "awm": awm,
    "tdm_r1": tdm_r1,
    "mix_grpo": MIX_GRPO,
    "gcpo": GCPO,
    "flash_grpo": FLASH_GRPO,
    "step_gain": STEP_GAIN_CASE,
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

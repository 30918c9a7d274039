"""Each method's case of the 2-process equality tests (``tests/methods/test_two_ranks_equal_one.py``): a function of
the tiny model's folder giving ``(args(out, *extra), check(one_dir, two_dir)[, the case whose 1-process fit it
shares])``, and :data:`DDP_CASES`, every method's case under DDP (FSDP2 adds its sharding checks to these). One batch
each (``max_steps`` counts optimizer steps: 2 for one batch of 2 minibatches), the step-credit schedules' two.

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

SGD = ["--model.init_args.optimizer=torch.optim.SGD", "--model.init_args.optimizer.lr=1.0"]
NO_CLIP = [*SGD, "--model.init_args.max_grad_norm=null"]


def plain(one: Path, two: Path) -> None:
    assert_two_ranks_equal_one(one, two)


def rewards_and_advantages(one: Path, two: Path) -> None:
    assert_two_ranks_equal_one(one, two, keys=("rewards", "advantages"))


def flow_grpo(tiny_model_dir):
    common = ["--trainer.max_steps=1", "--model.init_args.micro_batch_size=3", *NO_CLIP]
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


# the random window over [0, 3) of 5 steps, the ODE after it compressed (MixGRPO-Flash at 0.4: 1 step for the 3 or 2
# after a window ending at step 1 or 2); Flash's draw over 3 steps with the batch-mean weight (gathered); GCPO half
# of the chunks [1, 2] per sample, weighted by the latents' relative-L1 change (each rank's own latents)
MIX_GRPO = step_credit("--model.init_args.num_steps=5", "--model.init_args.sde_window=2",
                       "--model.init_args.window_strategy=random", "--model.init_args.window_range=[0, 3]",
                       "--model.init_args.tail_compress=0.4")
FLASH_GRPO = step_credit("--model.init_args.flash_pool=[0, 1, 2]", "--model.init_args.flash_noise=true",
                         "--model.init_args.rectify=batch")
GCPO = step_credit("--model.init_args.loss=chunk_gspo", "--model.init_args.loss_options={chunks: [1, 2]}",
                   "--model.init_args.train_chunks=0.5", "--model.init_args.chunk_weighting=normalized",
                   "--model.init_args.timestep_fraction=1.0")

# PODS: 2 of each group's 4 rows trained, chosen on the gathered batch (the ranks hold unequal shares of the kept rows)
PODS = step_credit("--model.init_args.downsample_to=2")

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


# Flow-GRPO under DDP: uneven_pairs (its subclass, whose ranks also hold unequal numbers of trained pairs); the plain
# flow_grpo case under FSDP2 only
DDP_CASES = {
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
    "pods": PODS,
    "uneven_pairs": uneven_pairs,
    "nan_on_one_rank": nan_on_one_rank,
}
#: the DDP cases FSDP2's list leaves out: the ranks' unequal trained pairs and a NaN on one rank are DDP's own checks;
#: PODS chooses on the gathered batch before any strategy acts, so one strategy checks it
DDP_ONLY = ("uneven_pairs", "nan_on_one_rank", "pods")

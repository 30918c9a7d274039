"""``python -m flowrl fit`` end to end on a random-weight tiny model: a 2-step fit, config errors, exact resume,
bit-for-bit rollouts (2 processes against 1, every method at once: tests/methods/test_two_ranks_equal_one.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flowrl.cli import main
from flowrl.sampling.flash import group_steps

HERE = Path(__file__).resolve().parent
CONFIG = str(HERE / "fit_tiny.yaml")


def fit_args(model_dir, out, *extra):
    return ["fit", "--config", CONFIG, f"--model.init_args.policy.init_args.model={model_dir}",
            f"--trainer.default_root_dir={out}", "--trainer.callbacks+=tests.cli.dump_outputs.DumpOutputs",
            f"--trainer.callbacks.out={out}/dump", *extra]


def load_steps(out):
    return {p.stem: torch.load(p) for p in sorted(Path(out, "dump").glob("step*.pt"))}


def test_two_step_fit_trains_and_is_reproducible(tiny_model_dir, tmp_path):
    main(fit_args(tiny_model_dir, tmp_path / "a"))
    main(fit_args(tiny_model_dir, tmp_path / "b"))
    a, b = load_steps(tmp_path / "a"), load_steps(tmp_path / "b")
    assert sorted(a) == ["step0_rank0", "step1_rank0"]
    for key in a:  # the same config and seed give the same rollouts and advantages, bit for bit
        assert torch.equal(a[key]["rewards"], b[key]["rewards"])
        assert torch.equal(a[key]["advantages"], b[key]["advantages"])
    first = a["step0_rank0"]
    assert first["advantages"].abs().sum() > 0 and len(first["group_ids"].unique()) == 2
    # group advantages have zero mean within each group on the trained steps
    adv = first["advantages"][:, 0]
    for gid in first["group_ids"].unique():
        assert adv[first["group_ids"] == gid].sum().abs() < 1e-4
    wa, wb = torch.load(tmp_path / "a/dump/weights.pt"), torch.load(tmp_path / "b/dump/weights.pt")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert any(wa[k].abs().sum() > 0 for k in wa if "lora_B" in k)  # LoRA B starts at 0 and was updated


def test_misspelled_key_fails_before_loading(tiny_model_dir, tmp_path):
    with pytest.raises(SystemExit, match="no option clip_rnage; did you mean --model.init_args.clip_range"):
        main(fit_args(tiny_model_dir, tmp_path, "--model.init_args.clip_rnage=0.1"))


def test_unknown_reward_class_and_missing_reward_fail_clearly(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(fit_args(tiny_model_dir, tmp_path, "--trainer.callbacks+=flowrl.rewards.PickScoreTypo"))
    assert "PickScoreTypo" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no reward callback"):
        main(["fit", "--config", CONFIG, f"--model.init_args.policy.init_args.model={tiny_model_dir}",
              "--trainer.callbacks=[]"])


def test_group_size_one_and_missing_model_fail_clearly(tmp_path, capsys):
    with pytest.raises((SystemExit, ValueError, FileNotFoundError)) as err:
        main(fit_args(str(tmp_path / "nope"), tmp_path))
    assert "does not exist" in str(err.value) + capsys.readouterr().err
    # checked before the model loads: this model path does not exist either
    with pytest.raises(SystemExit, match="data.group_size=1"):
        main(["fit", "--config", CONFIG, "--data.group_size=1", "--model.init_args.step_kind=sde",
              f"--model.init_args.policy.init_args.model={tmp_path / 'nope'}"])
    with pytest.raises(SystemExit, match="model.step_kind='sde'"):
        main(["fit", "--config", CONFIG, "--model.init_args.step_kind=sde"])


def g2rpo_fit_args(model_dir, out, *extra):
    """G²RPO's tree (one per prompt: a shared anchor, 2 members, 2 granularities) on fit_tiny.yaml."""
    from tests.methods.test_tree_methods import tree_fit  # that module imports this one
    return tree_fit(model_dir, out, "flowrl.methods.G2RPO", "--model.init_args.branches=2", *extra)


#: Flow-GRPO's step-credit options, whose draws read the batch count: MixGRPO's progressive window (one step a batch
#: over [0, 3) of 4 steps: batches 2 and 3 train steps 2 and 0, a restarted count would give 0 and 1), Flash-GRPO's
#: step per group and GCPO's chunks per sample (both drawn from the seed and the batch: a resume must not redraw
#: batch 0's)
RESUMED_OPTIONS = {
    "flow_grpo": [],
    "mix_grpo": ["--model.init_args.num_steps=4", "--model.init_args.sde_window=1",
                 "--model.init_args.window_shift_every=1", "--model.init_args.window_range=[0, 3]"],
    "flash_grpo": ["--model.init_args.flash_pool=[0, 1, 2]", "--model.init_args.flash_noise=true",
                   "--model.init_args.rectify=batch"],
    "lr_schedule": ["--model.init_args.lr_scheduler=torch.optim.lr_scheduler.LinearLR",
                    "--model.init_args.lr_scheduler.init_args.start_factor=1.0",
                    "--model.init_args.lr_scheduler.init_args.end_factor=0.25",
                    "--model.init_args.lr_scheduler.init_args.total_iters=3"],
    "gcpo": ["--model.init_args.loss=chunk_gspo", "--model.init_args.loss_options={chunks: [1, 2]}",
             "--model.init_args.train_chunks=0.5", "--model.init_args.timestep_fraction=1.0"],
}
#: the one-step gain credit (configs/tiny_step_gain.yaml) on fit_tiny.yaml: its step rewards read the sampler's
#: velocities, which a resumed run must sample again as the uninterrupted one did
STEP_GAIN = ["--model=flowrl.methods.DenseGRPO", "--model.init_args.completion_steps=0",
             "--model.init_args.calibration=null"]
RESUMED_OPTIONS["step_gain"] = STEP_GAIN


@pytest.mark.parametrize("method", [*RESUMED_OPTIONS, "g2rpo"])
def test_resume_continues_exactly(tiny_model_dir, tmp_path, method):
    # the uninterrupted run's own step-2 checkpoint is the one a run stopped at step 2 saves (the batch ends both)
    options, fit = RESUMED_OPTIONS.get(method, []), g2rpo_fit_args if method == "g2rpo" else fit_args
    ckpt = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
            "--trainer.callbacks.every_n_train_steps=2", "--trainer.callbacks.save_top_k=-1"]
    main(fit(tiny_model_dir, tmp_path / "straight", "--trainer.max_steps=4", *options, *ckpt))
    saved = next(Path(tmp_path / "straight").rglob("*step=2.ckpt"))
    main(fit(tiny_model_dir, tmp_path / "resumed", "--trainer.max_steps=4", *options, f"--ckpt_path={saved}"))
    straight, resumed = load_steps(tmp_path / "straight"), load_steps(tmp_path / "resumed")
    assert sorted(resumed) == ["step2_rank0", "step3_rank0"]
    for key in resumed:
        assert torch.equal(straight[key]["seeds"], resumed[key]["seeds"])
        assert torch.equal(straight[key]["advantages"], resumed[key]["advantages"])
    ws, wr = torch.load(tmp_path / "straight/dump/weights.pt"), torch.load(tmp_path / "resumed/dump/weights.pt")
    assert all(torch.equal(ws[k], wr[k]) for k in ws)
    trained = {key: [set(row.nonzero().flatten().tolist()) for row in step["advantages"]]
               for key, step in straight.items()}
    if method == "mix_grpo":  # the window went on from batch 2, not from a restarted count
        assert [set().union(*trained[f"step{b}_rank0"]) for b in range(4)] == [{0}, {1}, {2}, {0}]
    if method == "flash_grpo":  # each batch's draw, keyed by the batch count: not batch 0's again
        for b in range(4):
            drawn = group_steps(straight[f"step{b}_rank0"]["group_ids"], [0, 1, 2], seed=3, iteration=b)
            assert all(c <= {int(d)} for c, d in zip(trained[f"step{b}_rank0"], drawn))
    if method == "lr_schedule":  # once a batch from the config's 1e-2 to a quarter of it in 3, from batch 2 resumed
        expected = [1e-2 * (1 - 0.75 * min(b, 3) / 3) for b in (1, 2, 3, 4)]  # the rate after batch b - 1
        for b in range(4):
            assert straight[f"step{b}_rank0"]["lr"] == pytest.approx([expected[b]]), b
        assert resumed["step3_rank0"]["lr"] == straight["step3_rank0"]["lr"]
    if method == "step_gain":  # DenseGRPO's credit per step, not Flow-GRPO's one per trajectory
        assert not torch.equal(straight["step2_rank0"]["advantages"][:, 0], straight["step2_rank0"]["advantages"][:, 1])
    if method != "flow_grpo":
        return
    # a finished run's last.ckpt (saved when max_steps is reached on the epoch's last batch: 4 prompts / 2 groups = 2
    # batches per epoch) resumed to more steps: Lightning restarts the next epoch with its batch counter unreset
    last = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint", "--trainer.callbacks.save_last=true",
            "--trainer.callbacks.every_n_train_steps=100", f"--trainer.callbacks.dirpath={tmp_path}/finished/ckpt"]
    main(fit_args(tiny_model_dir, tmp_path / "finished", "--trainer.max_steps=2", *last))
    main(fit_args(tiny_model_dir, tmp_path / "more", "--trainer.max_steps=4",
                  f"--ckpt_path={tmp_path}/finished/ckpt/last.ckpt"))
    more = load_steps(tmp_path / "more")
    assert sorted(more) == ["step2_rank0", "step3_rank0"]
    for key in more:
        assert torch.equal(straight[key]["seeds"], more[key]["seeds"]), key
        assert torch.equal(straight[key]["advantages"], more[key]["advantages"]), key
    wm = torch.load(tmp_path / "more/dump/weights.pt")
    assert all(torch.equal(ws[k], wm[k]) for k in ws)


def run_cli(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "flowrl", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def assert_two_ranks_equal_one(one_dir: Path, two_dir: Path, keys=("rewards", "advantages", "group_ids")) -> dict:
    """The first step of a 2-process run (``two_dir``, dumped by DumpOutputs) equals a 1-process run's (``one_dir``):
    the same samples split over the ranks, the same per-sample ``keys`` and the same final LoRA weights, which moved.
    Returns the 1-process step."""
    one = load_steps(one_dir)["step0_rank0"]
    ranks = [load_steps(two_dir)[f"step0_rank{r}"] for r in (0, 1)]
    assert len(ranks[0]["seeds"]) == len(ranks[1]["seeds"]) == len(one["seeds"]) // 2
    seeds = torch.cat([r["seeds"] for r in ranks])
    order_two, order_one = seeds.argsort(), one["seeds"].argsort()
    assert torch.equal(seeds[order_two], one["seeds"][order_one])
    for key in keys:
        both = torch.cat([r[key] for r in ranks])[order_two]
        assert torch.allclose(both.float(), one[key][order_one].float(), atol=1e-5), key
    w1, w2 = torch.load(Path(one_dir, "dump/weights.pt")), torch.load(Path(two_dir, "dump/weights.pt"))
    assert all(torch.allclose(w1[k], w2[k], rtol=1e-4, atol=1e-7) for k in w1)
    assert any(not torch.equal(w1[k], torch.zeros_like(w1[k])) for k in w1 if "lora_B" in k)
    return one


def test_a_distributed_fit_has_its_process_group_end_before_the_interpreter_does(tiny_model_dir, tmp_path,
                                                                                 monkeypatch):
    # left to interpreter shutdown, gloo's worker threads can abort a finished run (exit -6) on the rank whose peer
    # has already gone; the command has an exit handler destroy the group (which a later fit in this process reuses)
    import atexit

    from flowrl.cli import process_group

    registered = []
    monkeypatch.setattr(process_group, "_registered", False)
    monkeypatch.setattr(atexit, "register", registered.append)
    main(fit_args(tiny_model_dir, tmp_path / "a", "--trainer.strategy=ddp", "--trainer.devices=1",
                  "--trainer.max_steps=1"))
    assert (tmp_path / "a/dump/step0_rank0.pt").exists() and torch.distributed.is_initialized()
    assert registered == [process_group.end_process_group]
    assert process_group.end_process_group() and not torch.distributed.is_initialized()
    main(fit_args(tiny_model_dir, tmp_path / "b", "--trainer.max_steps=1"))  # no group: nothing more to end
    assert registered == [process_group.end_process_group]

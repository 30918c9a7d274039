"""A checkpoint that cannot serve says so in its first line, before any weight loads: a missing, empty or cut-off one
given to ``predict`` or ``export``, a run's folder given for its checkpoint (taken: its last.ckpt), a checkpoint of
another method resumed, predicted or exported (both methods and what is missing named, not torch's key list), and
``predict``'s own bad options (``--seeds`` out of range, an ``--out`` that cannot be written)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from flowrl.cli import main
from flowrl.cli.predict import predict_arguments
from flowrl.checkpoints.loading import load_policy
from tests.cli.test_fit import CONFIG as CONFIG_OF_TESTS
from tests.cli.test_fit import fit_args, load_steps

# one xdist worker runs this file (pytest's --dist loadgroup): its module's fit (flow_grpo_run) is built once, not
# once per worker
pytestmark = pytest.mark.xdist_group("flow_grpo_run")

ROOT = Path(__file__).resolve().parents[2]
MISSING = "/no/such/model/folder"  # where a config would load a model: never reached


@pytest.fixture(scope="module")
def flow_grpo_run(tmp_path_factory, tiny_model_dir):
    """A 1-step Flow-GRPO run (LoRA rank 4) with its config.yaml and checkpoints/last.ckpt."""
    out = tmp_path_factory.mktemp("flow_grpo_run")
    main(fit_args(tiny_model_dir, out, "--trainer.max_steps=1", "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
                  f"--trainer.logger.save_dir={out}", "--trainer.callbacks+=lightning.pytorch.callbacks"
                  ".ModelCheckpoint", "--trainer.callbacks.save_last=true"))
    (run,) = out.glob("lightning_logs/version_0")
    return run


def fails(*args) -> str:
    with pytest.raises(SystemExit) as err:
        main(list(args))
    return str(err.value)


@pytest.mark.parametrize("content, message", [(None, "does not exist"), (b"", "is empty (0 bytes"),
                                              (b"PK\x03\x04 cut", "is not a complete checkpoint")])
def test_predict_and_export_name_a_bad_checkpoint_first(tmp_path, content, message):
    ckpt = tmp_path / "run.ckpt"
    if content is not None:
        ckpt.write_bytes(content)
    for out in (fails("predict", "--ckpt_path", str(ckpt), "--prompts", "a"),
                fails("export", "--ckpt", str(ckpt), "--out", str(tmp_path / "out"))):
        first = out.splitlines()[1] if out.startswith("flowrl predict") else out
        assert f"'{ckpt}' {message}" in first and "config.yaml" not in out, out


def test_predict_options_out_of_range_or_unwritable_fail_before_loading(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")  # nothing can be created below a file, even by root (a read-only folder is not, for root)
    out = fails("predict", "--config", str(ROOT / "configs/quickstart.yaml"), "--prompts", "a",
                "--seeds", "1", "99999999999999999999", "--out", str(blocker / "images"),
                f"--model.init_args.policy.init_args.model={MISSING}")
    assert "--seeds 99999999999999999999: a seed must be in [0, 2**63)" in out
    assert f"--out {blocker}/images cannot be written (NotADirectoryError" in out


def test_a_rejected_predict_leaves_no_out_folder_behind(tmp_path):
    # rejected by predict's own options (the seed), then by LightningCLI's parser (a misspelled key): --out is checked
    # for writing both times, and neither leaves the folder (or its missing parents) made
    for bad in (["--seeds", "99999999999999999999"], ["--model.init_args.clip_rnage=0.1"]):
        out = tmp_path / "new" / "images"
        fails("predict", "--config", str(ROOT / "configs/quickstart.yaml"), "--prompts", "a", "--out", str(out), *bad)
        assert list(tmp_path.iterdir()) == [], bad


def can_write(folder: Path) -> bool:
    try:
        (folder / "probe").write_text("")
    except OSError:
        return False
    (folder / "probe").unlink()
    return True


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder that takes no new file: mode 555 for a user who is not root, else (root writes there anyway) a
    read-only tmpfs mounted on it; skipped where neither holds."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    mounted = can_write(folder) and subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=16k", "tmpfs", str(folder)],
                                                   capture_output=True).returncode == 0
    try:
        if can_write(folder):
            pytest.skip("root here, and a read-only tmpfs cannot be mounted (no CAP_SYS_ADMIN)")
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)
        folder.chmod(0o755)


@pytest.mark.parametrize("below", ["", "images"])
def test_predict_out_in_a_read_only_folder_fails_before_loading(read_only_folder, below):
    out = read_only_folder / below
    message = fails("predict", "--config", str(ROOT / "configs/quickstart.yaml"), "--prompts", "a", "--out", str(out),
                    f"--model.init_args.policy.init_args.model={MISSING}")
    # a read-only folder: PermissionError (mode 555) or "Read-only file system" (the mount)
    assert re.search(rf"--out {out} cannot be written \((PermissionError|OSError: \[Errno 30\])", message), message
    assert list(read_only_folder.iterdir()) == []


def test_a_checkpoint_of_another_method_is_named_before_loading(flow_grpo_run, tmp_path):
    ckpt = str(flow_grpo_run / "checkpoints/last.ckpt")
    written = f"ckpt_path='{ckpt}' was written by flowrl.methods.FlowGRPO (LoRA adapters: default (rank 4))"
    for config, method, missing in (("tiny_tdm_r1.yaml", "TDMR1", "fake_score, surrogate, surrogate_old"),
                                    ("tiny_diffusion_nft.yaml", "DiffusionNFT", "old")):
        args = ["--config", str(ROOT / "configs" / config), "--model.init_args.policy.init_args.lora.rank=4"]
        resumed = fails("fit", *args, f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path}")
        assert written in resumed and f"the config's flowrl.methods.{method} needs" in resumed
        assert f"missing: {missing}." in resumed and len(resumed) < 1000  # not torch's list of every key
        predicted = fails("predict", "--ckpt_path", ckpt, *args, "--prompts", "a")
        assert written in predicted and "Leave --config out" in predicted
    exported = fails("export", "--ckpt", ckpt, "--out", str(tmp_path / "x"),
                     "--config", str(ROOT / "configs/tiny_tdm_r1.yaml"))  # its policy trains rank 16
    assert exported.startswith(f"flowrl export: --ckpt '{ckpt}' was written by flowrl.methods.FlowGRPO")
    assert "rank 4 in the checkpoint, 16 in model.init_args.policy.init_args.lora.rank" in exported


def test_a_run_folder_stands_for_its_last_checkpoint(flow_grpo_run):
    # export's loader (the command itself, on a pipeline policy: tests/policies/test_export.py)
    policy = load_policy(flow_grpo_run)  # the folder's last.ckpt, not "does not exist"
    saved = torch.load(flow_grpo_run / "checkpoints/last.ckpt", weights_only=False)["state_dict"]
    lora = {k: v for k, v in policy.state_dict().items() if "lora_B" in k}
    assert lora and all(torch.equal(v, saved["policy." + k]) for k, v in lora.items())


def test_predict_arguments_for_a_sharded_run_folder_ask_for_one_process(tmp_path):
    # the run's config says 2 devices and fsdp2: predict started 2 processes, then asked for one
    run = tmp_path / "version_0"
    (run / "checkpoints/last.ckpt").mkdir(parents=True)
    (run / "checkpoints/last.ckpt/meta.pt").write_bytes(b"")  # a sharded checkpoint's folder
    (run / "config.yaml").write_text("trainer: {devices: 2, strategy: fsdp2}\n")
    args = predict_arguments(["--ckpt_path", str(run), "--prompts", "a"])
    assert args[args.index("--ckpt_path") + 1] == str(run / "checkpoints/last.ckpt")
    assert args[args.index("--config") + 1] == str(run / "config.yaml")
    assert {"--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=fsdp2"} <= set(args)
    (run / "checkpoints/last.ckpt/meta.pt").unlink()
    (run / "checkpoints/last.ckpt").rmdir()
    torch.save({}, run / "checkpoints/last.ckpt")  # a 1-file checkpoint: no sharding needed
    assert "--trainer.strategy=auto" in predict_arguments(["--ckpt_path", str(run), "--prompts", "a"])


def resumable(tiny_model_dir, out: Path, *extra: str) -> list[str]:
    """The fixture run's command line (its logger and checkpoints in ``out``), with ``extra``."""
    return fit_args(tiny_model_dir, out, "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
                    f"--trainer.logger.save_dir={out}", "--trainer.callbacks+=lightning.pytorch.callbacks"
                    ".ModelCheckpoint", "--trainer.callbacks.save_last=true", *extra)


def test_ckpt_path_last_resumes_the_newest_version_or_is_refused(flow_grpo_run, tiny_model_dir, tmp_path, capsys):
    shutil.copytree(flow_grpo_run, tmp_path / "lightning_logs/version_0")  # a run that stopped at step 1
    (tmp_path / "lightning_logs/version_1").mkdir()  # a later run that saved nothing: skipped
    main(resumable(tiny_model_dir, tmp_path, "--trainer.max_steps=2", "--ckpt_path=last"))
    assert sorted(load_steps(tmp_path)) == ["step1_rank0"]  # resumed at step 1, not trained from step 0
    assert f"loading {tmp_path}/lightning_logs/version_0/checkpoints/last.ckpt" in capsys.readouterr().out
    empty = tmp_path / "empty"
    message = fails(*resumable(tiny_model_dir, empty, "--ckpt_path=last"))
    assert f"ckpt_path=last: no checkpoint in any version folder of {empty / 'lightning_logs'}" in message, message
    assert not load_steps(empty)  # refused before training


def test_a_resume_that_would_train_nothing_is_refused_before_loading(flow_grpo_run, tiny_model_dir, tmp_path):
    ckpt = flow_grpo_run / "checkpoints/last.ckpt"  # saved at step 1: resumed with the finished run's own max_steps
    message = fails(*resumable(tiny_model_dir, tmp_path, "--trainer.max_steps=1", f"--ckpt_path={ckpt}",
                               f"--model.init_args.policy.init_args.model={MISSING}"))  # refused before any load
    assert (f"ckpt_path='{ckpt}' was saved at step 1 and trainer.max_steps=1: the resumed run would train nothing; "
            "raise trainer.max_steps above 1") in message, message


def test_a_checkpoint_of_another_policy_family_is_named_before_loading(flow_grpo_run, tiny_model_dir, tmp_path):
    saved = torch.load(flow_grpo_run / "checkpoints/last.ckpt", weights_only=False)
    # recorded as another family's (the adapters' names and ranks are the same: the old check passed it)
    torch.save({**saved, "flowrl_policy": "flowrl.policies.SD3Policy"}, tmp_path / "sd3.ckpt")
    # an older checkpoint, recording nothing, whose LoRA sits on modules the tiny policy's targets do not name
    renamed = {k.replace(".attn.", ".attention."): v for k, v in saved["state_dict"].items()}
    torch.save({**{k: v for k, v in saved.items() if k != "flowrl_policy"}, "state_dict": renamed},
               tmp_path / "other.ckpt")
    sd3 = fails(*resumable(tiny_model_dir, tmp_path, "--trainer.max_steps=2", f"--ckpt_path={tmp_path}/sd3.ckpt"))
    assert (f"ckpt_path='{tmp_path}/sd3.ckpt' holds the weights of a flowrl.policies.SD3Policy policy (recorded in "
            "the checkpoint); the config builds flowrl.policies.TinyFlowPolicy") in sd3, sd3
    assert "resume with the config it was trained with" in sd3.lower()
    predicted = fails("predict", "--ckpt_path", f"{tmp_path}/sd3.ckpt", "--config", CONFIG_OF_TESTS, "--prompts", "a",
                      f"--model.init_args.policy.init_args.model={tiny_model_dir}")
    assert "holds the weights of a flowrl.policies.SD3Policy policy" in predicted, predicted
    other = fails(*resumable(tiny_model_dir, tmp_path, "--trainer.max_steps=2", f"--ckpt_path={tmp_path}/other.ckpt"))
    assert "that the config's flowrl.policies.TinyFlowPolicy LoRA targets (attn.to_q, " in other, other
    assert ".attention.add_k_proj: a checkpoint of another model family or of other lora.target_modules" in other
    assert not load_steps(tmp_path)
    assert saved["flowrl_policy"] == "flowrl.policies.tiny.TinyFlowPolicy"  # every checkpoint records its policy

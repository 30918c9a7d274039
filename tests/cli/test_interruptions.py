"""A stopped or doomed run says so: SIGTERM says at once that the run stops, which it does after the current batch,
with a checkpoint that resumes, the run summary and exit status 143 (during the validation before training, after
its current batch: no training batch follows); a folder the run cannot write fails before the first rollout instead
of at the first save. The runs are in pytest's process (a launched one would pay its imports, ~10 CPU-s, for the
same handlers): the signal comes from a thread, or from a callback at the moment a check needs."""

import os
import signal

import pytest
import torch
from lightning.pytorch import Callback

from flowrl.cli import main
from flowrl.methods.validation import Validation
from tests.cli.test_fit import fit_args, load_steps
from tests.sigterm import sigterm_when


def test_sigterm_says_it_stops_saves_a_checkpoint_that_resumes_prints_the_summary_and_exits_143(tiny_model_dir,
                                                                                                   tmp_path, capfd):
    # the run's ModelCheckpoint as a config has it: save_last, no save_on_exception, and here no periodic saves
    # either, so a checkpoint can only be the one the stop saves; in this process, signalled from a thread at a
    # moment the run does not choose (as a scheduler would)
    ckpt = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint", f"--trainer.callbacks.dirpath={tmp_path}"
            "/run/ckpt", "--trainer.callbacks.save_last=true", "--trainer.callbacks.every_n_epochs=0"]
    args = fit_args(tiny_model_dir, tmp_path / "run", "--trainer.max_steps=100000", *ckpt,
                    "--trainer.callbacks+=flowrl.callbacks.RunSummary")
    dump = tmp_path / "run" / "dump"  # DumpOutputs writes step<k>_rank0.pt at the end of each batch
    ended = []  # the batches that had ended when the signal was sent

    def two_batches_ended() -> bool:
        if (dump / "step1_rank0.pt").exists():
            ended.append(len(list(dump.glob("step*_rank0.pt"))))
        return bool(ended)

    with sigterm_when(two_batches_ended), pytest.raises(SystemExit) as stopped:
        main(args)
    out = capfd.readouterr().out
    assert stopped.value.code == 128 + signal.SIGTERM, out[-3000:]  # 143, as a shell reports a SIGTERM'd command
    done = ended[0]
    said = [line for line in out.splitlines() if line.startswith("flowrl: SIGTERM received: stopping after the "
                                                                  "current batch")]
    assert len(said) == 1 and f"saving a checkpoint to {tmp_path}/run/ckpt" in said[0], out[-3000:]
    # the batch running at the signal finished (one more may have ended before it arrived), and no other began
    step = len(list(dump.glob("step*_rank0.pt")))
    assert done <= step <= done + 2, (done, step)
    last = tmp_path / "run/ckpt/last.ckpt"
    saved = torch.load(last, weights_only=False)
    assert saved["global_step"] == step  # one optimizer step per batch in fit_tiny.yaml
    assert (f"flowrl run summary (stopped by SIGTERM at global step {step}; resume with --ckpt_path {last})"
            in out), out[-3000:]
    assert f"over {step} batches ({step} optimizer steps)" in out
    # it resumes as the run would have gone on: the next two batches equal an uninterrupted run's
    main(fit_args(tiny_model_dir, tmp_path / "resumed", f"--trainer.max_steps={step + 2}", f"--ckpt_path={last}"))
    main(fit_args(tiny_model_dir, tmp_path / "straight", f"--trainer.max_steps={step + 2}"))
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # this process's own handler is back
    resumed, straight = load_steps(tmp_path / "resumed"), load_steps(tmp_path / "straight")
    assert sorted(resumed) == [f"step{step}_rank0", f"step{step + 1}_rank0"]
    for key in resumed:
        assert torch.equal(straight[key]["seeds"], resumed[key]["seeds"]), key
        assert torch.equal(straight[key]["advantages"], resumed[key]["advantages"]), key


class SigtermAtTrainStart(Callback):
    """Sends this process a SIGTERM when training starts, just before the run summary's validation (the next
    callback): the handlers a launched run installs are the same in pytest's process (the launched stop and its exit
    status 143 are the test above)."""

    def on_train_start(self, trainer, pl_module):
        os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_during_the_validation_before_training_stops_at_its_next_batch(tiny_model_dir, tmp_path, capfd,
                                                                               monkeypatch):
    prompts = [f"red {i % 10} and blue {(i + 3) % 10}" for i in range(256)]  # 256 batches of one
    args = fit_args(tiny_model_dir, tmp_path / "run", f"--trainer.callbacks+={__name__}.SigtermAtTrainStart",
                    "--trainer.callbacks+=flowrl.callbacks.RunSummary", f"--data.val_prompts={prompts}",
                    "--data.val_batch_size=1", "--data.val_samples_per_prompt=1")
    tally, tallied = Validation._tally, []
    monkeypatch.setattr(Validation, "_tally", lambda self, batch: tallied.append(1) or tally(self, batch))
    with pytest.raises(SystemExit) as stopped:
        main(args)
    out = capfd.readouterr().out
    assert len(tallied) == 1  # the signal came before the first batch: that batch, then the stop
    assert stopped.value.code == 128 + signal.SIGTERM, out[-3000:]
    assert out.count("flowrl: SIGTERM received: stopping after the current batch (at global step 0 now), then "
                     "saving no checkpoint (nothing is trained yet)") == 1, out[-3000:]
    assert "flowrl run summary (stopped by SIGTERM at global step 0" in out, out[-3000:]
    assert "at the start (not evaluated at the stop)" not in out  # the validation did not run to its end
    assert not list((tmp_path / "run" / "dump").glob("step*.pt"))  # and no training batch followed it
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # this process's own handler is back


def test_a_run_that_fails_gives_back_the_sigterm_handler(tiny_model_dir, tmp_path):
    with pytest.raises(RuntimeError, match="batches in a row trained no"):  # fails after the handler was installed
        main(fit_args(tiny_model_dir, tmp_path, "--model.class_path=tests.methods.test_trained_pairs.NaNAdvantages",
                      "--model.init_args.max_untrained_batches=1"))
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a later SIGTERM still ends this process


def test_an_unwritable_checkpoint_folder_fails_before_the_first_rollout(tiny_model_dir, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")  # nothing can be created below a file, even by root
    with pytest.raises(PermissionError, match=rf"cannot write to {blocker}/ckpt .*ModelCheckpoint dirpath"):
        main(fit_args(tiny_model_dir, tmp_path, "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                      f"--trainer.callbacks.dirpath={blocker}/ckpt"))
    assert not list((tmp_path / "dump").glob("step*.pt"))  # no batch was sampled

"""What a person wants at the end of a run: where things are, and how the reward moved.

Evaluates the validation prompts (fixed seeds, deterministic ODE sampler) before the first step and after the
last, logs both as ``val/reward/<name>`` (at step 0 and at the last step, so the loggers' curves start from the
base model), and prints them with the first and last training reward, the log folder, the sample grids and the
checkpoint.
"""

from __future__ import annotations

from typing import Optional

from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint


def log_lines(trainer) -> list[str]:
    """Where the loggers write, one line per folder (a run's TensorBoard events and metrics.csv share one)."""
    if not trainer.loggers:
        return [f"  logs:        none (trainer.logger is off); outputs under {trainer.default_root_dir}"]
    folders: dict[str, list[str]] = {}
    for logger in trainer.loggers:
        what = {"CSVLogger": "metrics.csv", "TensorBoardLogger": "TensorBoard"}.get(type(logger).__name__)
        folders.setdefault(str(getattr(logger, "log_dir", None) or logger.save_dir), []).append(
            what or type(logger).__name__)
    return [f"  logs:        {folder} ({', '.join(kinds)})" for folder, kinds in folders.items()]


class RunSummary(Callback):
    """Prints a summary at the end of ``fit``; ``self.before``/``self.after`` hold the validation rewards."""

    def __init__(self, evaluate: bool = True):
        self.evaluate = evaluate
        self.before: Optional[dict[str, float]] = None
        self.after: Optional[dict[str, float]] = None
        self.train_rewards: list[float] = []

    def _evaluate(self, trainer, pl_module) -> Optional[dict[str, float]]:
        datamodule = trainer.datamodule
        if not self.evaluate or datamodule is None or not getattr(datamodule, "val_prompts", None):
            return None
        when = "after" if self.before is not None else "before"
        return pl_module.evaluate(datamodule.val_dataloader(), progress=f"validation {when}")

    @staticmethod
    def _step(trainer) -> int:
        # the x of Lightning's own logged rows: batches, not optimizer steps (several per batch with minibatches)
        return getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step)

    @staticmethod
    def _log(trainer, values: Optional[dict[str, float]], step: int) -> None:
        if not values:
            return
        for logger in trainer.loggers:  # rank zero only, as Lightning's loggers
            logger.log_metrics({f"val/reward/{name}": value for name, value in values.items()}, step=step)
            logger.save()

    def on_train_start(self, trainer, pl_module) -> None:
        self.before = self._evaluate(trainer, pl_module)
        self._log(trainer, self.before, self._step(trainer))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # what the loggers got: the weighted total over the valid samples of every rank (a non-finite score is left
        # out, never counted as 0)
        total = trainer.callback_metrics.get("train/reward/total")
        if total is not None:
            self.train_rewards.append(float(total))

    def on_fit_end(self, trainer, pl_module) -> None:
        self.after = self._evaluate(trainer, pl_module)
        self._log(trainer, self.after, self._step(trainer))
        self.print_summary(trainer)

    def print_summary(self, trainer, stopped: Optional[str] = None, checkpoint: Optional[str] = None) -> None:
        """Prints the summary on rank zero; ``stopped``: why the run ended early (``SigtermStop``), which leaves the
        closing validation out (a preemption leaves no time for it) and names ``checkpoint`` to resume from."""
        ckpt = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)
        saved = checkpoint or (ckpt and (ckpt.last_model_path or ckpt.best_model_path))
        title = "flowrl run summary" + (f" ({stopped}; resume with --ckpt_path {saved})" if stopped and saved else
                                        f" ({stopped}; no checkpoint saved)" if stopped else "")
        lines = ["", title, *log_lines(trainer)]
        grids = [c.dir for c in trainer.callbacks if getattr(c, "dir", None) is not None]
        if grids:
            lines.append(f"  samples:     {grids[0]}")
        if saved:
            lines.append(f"  checkpoint:  {saved}")
        if self.train_rewards:
            lines.append(f"  train reward/total (as logged): first batch {self.train_rewards[0]:.4f} -> "
                         f"last batch {self.train_rewards[-1]:.4f} over {len(self.train_rewards)} batches "
                         f"({trainer.global_step} optimizer steps)")
        if self.before and self.after and not stopped:
            for name in self.after:
                if not name.endswith("_nonfinite"):
                    lines.append(f"  val {name}: {self.before[name]:.4f} -> {self.after[name]:.4f}")
            for name in sorted({k for k in {**self.before, **self.after} if k.endswith("_nonfinite")}):
                lines.append(f"  val {name} (left out of the means): {self.before.get(name, 0):g} -> "
                             f"{self.after.get(name, 0):g}")
        elif self.before and stopped:
            for name in self.before:
                if not name.endswith("_nonfinite"):
                    lines.append(f"  val {name}: {self.before[name]:.4f} at the start (not evaluated at the stop)")
        if trainer.is_global_zero:  # printed, not logged: the last thing a quickstart user reads
            print("\n".join(lines), flush=True)

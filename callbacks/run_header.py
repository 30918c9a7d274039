"""What a person wants on the first screen of a run: which model, method and rewards, the batch, the length of the
run and where the logs go, in a few lines printed when ``fit`` starts (before the progress bar).

It also stands in for Lightning's "Found N module(s) in eval mode" warning, which every flowrl run would print:
models load in eval mode (diffusers' and transformers' ``from_pretrained``) and the frozen text encoders stay so on
purpose. One line says which parts are in eval mode, and a warning is raised only when that changes what training
does: a dropout (``p > 0``) or batch-norm module left in eval mode inside a part with trained parameters. The flowrl
CLI adds this callback to every ``fit``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.model_summary import get_human_readable_count

from flowrl.callbacks.run_summary import RunSummary, log_lines


def model_label(path: str) -> str:
    """A model folder as a user named it: ``flowrl/<name>`` for an embedded model, ``org/name`` for a hub cache
    snapshot, the path otherwise.

    >>> model_label("/x/flowrl/assets/tiny-digits"), model_label("/h/models--org--sd3/snapshots/ab12/transformer")
    ('flowrl/tiny-digits', 'org/sd3')
    """
    if match := re.search(r"models--([^/]+)--([^/]+)/snapshots/", path):
        return f"{match[1]}/{match[2]}"
    parts = Path(path).parts
    if len(parts) >= 3 and parts[-3:-1] == ("flowrl", "assets"):
        return f"flowrl/{parts[-1]}"
    return path


def eval_parts(module, depth: int = 2) -> list[str]:
    """The parts (names cut to ``depth`` levels) that hold modules in eval mode.

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Dropout(0.1)))
    >>> _ = net[1].eval()
    >>> eval_parts(net)
    ['1']
    """
    parts = {".".join(name.split(".")[:depth]) for name, m in module.named_modules() if name and not m.training}
    return sorted(p for p in parts if not any(p.startswith(q + ".") for q in parts))


def train_behaviour_in_eval(module) -> list[str]:
    """Modules that act differently in training (dropout with ``p > 0``, batch norm) left in eval mode inside a
    parent that holds trained parameters: the case Lightning's eval-mode warning is for.

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))
    >>> train_behaviour_in_eval(net[1].eval() and net), train_behaviour_in_eval(net.requires_grad_(False))
    (['1'], [])
    """
    modules = dict(module.named_modules())
    out = []
    for name, m in modules.items():
        sensitive = isinstance(m, torch.nn.modules.batchnorm._BatchNorm) or (
            isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0)
        parent = modules[name.rpartition(".")[0]] if name else None
        if sensitive and not m.training and parent is not None and any(p.requires_grad for p in parent.parameters()):
            out.append(name)
    return out


def batch_line(prompts: int, group_size: int, method, trainer) -> str:
    """What one batch is and costs: prompts x samples, the rollouts (trajectories or trees of leaves) they come from,
    the processes, the sampling steps and the model evaluations (the method's ``rollout_cost``).

    >>> from types import SimpleNamespace as N
    >>> method = N(num_steps=10, rollout_cost=lambda: (16, 111))
    >>> trainer = N(world_size=1, strategy=N(root_device=N(type="cpu")))
    >>> batch_line(4, 16, method, trainer)
    '4 prompts x 16 samples = 64 per batch (4 trees of 16 leaves) on 1 process (cpu); 10 sampling steps, 444 model evaluations per batch'
    >>> dense = N(num_steps=10, rollout_cost=lambda: (1, 65), calibration_evaluations=lambda: 32 * 5 * 65)
    >>> batch_line(8, 4, dense, trainer).partition("steps, ")[2]  # tiny_dense_grpo.yaml: 32 x 65; 5 x 32 x 65
    '2,080 model evaluations per batch; the first batch 12,480 with the 10,400 of its calibration (model.calibration)'
    >>> split = N(world_size=8, strategy=N(root_device=N(type="cuda"), context_parallel_size=2))
    >>> batch_line(4, 4, N(), split)
    '4 prompts x 4 samples = 16 per batch on 8 processes in 4 groups of 2 splitting each clip (cuda)'
    """
    processes = f"{trainer.world_size} process{'es' if trainer.world_size > 1 else ''}"
    if (split := getattr(trainer.strategy, "context_parallel_size", 1)) > 1:  # a group draws one replica's rows
        processes += f" in {trainer.world_size // split} groups of {split} splitting each clip"
    line = f"{prompts} prompts x {group_size} samples = {prompts * group_size} per batch"
    cost = method.rollout_cost() if hasattr(method, "rollout_cost") else None
    if cost is not None and cost[0] > 1:  # rows are trees: say how many and how large
        line += f" ({prompts * group_size // cost[0]} trees of {cost[0]} leaves)"
    line += f" on {processes} ({trainer.strategy.root_device.type})"
    steps = getattr(method, "num_steps", None)
    if steps:
        line += f"; {steps} sampling steps"
    if cost is not None:
        per_batch = prompts * group_size // cost[0] * cost[1]
        line += f", {per_batch:,} model evaluations per batch"
        # work before the first batch's rollout (DenseGRPO's noise calibration) is paid once, in that batch
        if extra := getattr(method, "calibration_evaluations", lambda: 0)():
            line += f"; the first batch {per_batch + extra:,} with the {extra:,} of its calibration (model.calibration)"
    return line


class RunHeader(Callback):
    """Prints the run's header at the start of ``fit`` (global rank zero); ``self.lines`` keeps it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            self.lines = self.header(trainer, pl_module)
            print("\n".join(self.lines), flush=True)
        if stuck := train_behaviour_in_eval(pl_module):
            rank_zero_warn(f"{len(stuck)} dropout or batch-norm module(s) in a trained part are in eval mode and act "
                           f"as at inference ({', '.join(stuck[:3])}); call .train() on them in the policy if that is "
                           "not meant")

    def header(self, trainer, pl_module) -> list[str]:
        policy = getattr(pl_module, "policy", None)
        lines = [f"flowrl fit: {type(pl_module).__name__}" + (f" on {self.policy_line(policy)}" if policy else "")]
        params = list(pl_module.parameters())
        trained = sum(p.numel() for p in params if p.requires_grad)
        lines.append(f"  trains:      {get_human_readable_count(trained)} of "
                     f"{get_human_readable_count(sum(p.numel() for p in params))} parameters")
        from flowrl.rewards.base import reward_callbacks

        rewards = reward_callbacks(trainer.callbacks)
        lines.append("  rewards:     " + (", ".join(f"{r.name} x {r.weight:g}" for r in rewards) or "none"))
        lines += self.data_lines(trainer, pl_module)
        lines += log_lines(trainer)
        if parts := eval_parts(pl_module):
            count = sum(not m.training for m in pl_module.modules())
            clean = "" if train_behaviour_in_eval(pl_module) else "; no dropout or batch norm in a trained part"
            lines.append(f"  eval mode:   {count} modules as loaded ({', '.join(parts[:4])}"
                         f"{', ...' if len(parts) > 4 else ''}){clean}")
        return lines

    @staticmethod
    def policy_line(policy) -> str:
        denoiser = getattr(policy, "denoiser", None)
        path: Optional[str] = getattr(getattr(denoiser, "config", None), "_name_or_path", None)
        label = type(policy).__name__ + (f" ({model_label(path)})" if path else "")
        lora = getattr(policy, "lora", None)
        if lora is not None:
            return f"{label}, LoRA rank {lora.rank} alpha {lora.alpha:g}"
        return f"{label}, full fine-tuning"

    @staticmethod
    def data_lines(trainer, pl_module) -> list[str]:
        data = trainer.datamodule
        lines = []
        if data is not None and hasattr(data, "num_groups") and hasattr(data, "group_size"):
            lines.append("  batch:       " + batch_line(data.num_groups, data.group_size, pl_module, trainer))
        length = f"{trainer.max_steps} optimizer steps" if trainer.max_steps > 0 else "until stopped"
        val = getattr(data, "val_prompts", None)
        if val:
            every = trainer.val_check_interval
            when = f"every {every} batches" if isinstance(every, int) else "each epoch"
            if trainer.limit_val_batches == 0:  # the loop never validates: only RunSummary's before and after remain
                summary = any(isinstance(cb, RunSummary) and cb.evaluate for cb in trainer.callbacks)
                when = "before the first batch and after the last" if summary else "never (limit_val_batches 0)"
            ode = getattr(pl_module, "eval_num_steps", None)
            seeds = getattr(data, "val_samples_per_prompt", 1)
            length += (f"; validation on {len(val)} prompt{'s' if len(val) > 1 else ''} x {seeds} seed"
                       f"{'s' if seeds > 1 else ''}"
                       + (f" ({ode}-step ODE)" if ode else "") + f" {when}")
        lines.append(f"  run:         {length}")
        return lines

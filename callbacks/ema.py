"""EMA of the trainable weights only: a float32 shadow of the LoRA (or fully trained) parameters.

Lightning's ``EMAWeightAveraging`` averages an ``AveragedModel``, a deep copy of the whole LightningModule: for
SD3.5-M with LoRA r32 that is a second copy of the frozen text encoders, VAE and transformer (~16 GB in bf16) to
average 18.8M LoRA numbers (75 MB in float32). This callback keeps those numbers only, as flow_grpo's
``EMAModuleWrapper`` does, and is not a ``WeightAveraging`` subclass because that class builds the full copy in
``setup``. After each training batch that passes a multiple of ``every_n_steps`` optimizer steps:

    shadow <- shadow + (1 - d) (theta - shadow),   d = min(decay, (1 + n) / (10 + n)) with warm-up, else decay

with ``n`` the optimizer steps taken since ``start_step`` (flow_grpo passes its optimizer step count, not the
number of EMA updates; diffusers' ``EMAModel`` has the same ``(1 + n) / (10 + n)`` warm-up).

Under FSDP2 (``--trainer.strategy=fsdp2``) the trained weights are DTensor shards, and so is the average: each rank
averages and swaps in its own shard with no communication (memory per rank: its shard), the sharded checkpoint keeps
every rank's shard (``flowrl.strategies.fsdp2``), and ``python -m flowrl export --ema`` gathers them whole.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, distribute_tensor


def ema_decay(decay: float, n: int, warmup: bool) -> float:
    """The decay of the update after ``n`` optimizer steps: ``min(decay, (1 + n) / (10 + n))`` with warm-up.

    >>> ema_decay(0.9, 1, warmup=True)  # 2 / 11: the first update keeps 9/11 of the new weights
    0.18181818181818182
    >>> ema_decay(0.9, 80, warmup=True), ema_decay(0.9, 1, warmup=False)  # 81 / 90 = 0.9: warm-up over
    (0.9, 0.9)
    """
    return min(decay, (1 + n) / (10 + n)) if warmup else decay


def _copy_(targets: list[Tensor], sources: list[Tensor]) -> None:
    """``torch._foreach_copy_``, one tensor at a time for DTensor shards (FSDP2), which it has no rule for."""
    if any(isinstance(t, DTensor) for t in targets):
        for target, source in zip(targets, sources):
            target.copy_(source)
    else:
        torch._foreach_copy_(targets, sources)


def trainable_parameters(pl_module: nn.Module, adapter: Optional[str] = None) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of what the optimizer trains: ``pl_module.policy.trainable_parameters(adapter)`` when
    the module has a policy (``adapter``: only that LoRA adapter's), else every parameter with ``requires_grad``;
    names as in ``pl_module.state_dict()``."""
    policy = getattr(pl_module, "policy", None)
    if callable(getattr(policy, "trainable_parameters", None)):
        params = policy.trainable_parameters(adapter) if adapter is not None else policy.trainable_parameters()
    else:
        params = [p for p in pl_module.parameters() if p.requires_grad]
    names = {id(p): name for name, p in pl_module.named_parameters()}
    missing = [tuple(p.shape) for p in params if id(p) not in names]
    if missing:
        raise ValueError(f"EMA: the policy's trainable parameters of shapes {missing} are not parameters of the "
                         "LightningModule; register them as submodules of the module so checkpoints carry them")
    return [(names[id(p)], p) for p in params]


class EMA(Callback):
    """A float32 exponential moving average of the trainable parameters, used for validation and (by default) as
    the final weights; its state is in the checkpoint, so ``--ckpt_path`` resumes it exactly.

    Args:
        decay: the weight kept from the average at each update, in (0, 1) (flow_grpo: 0.9).
        every_n_steps: update after the training batch in which the optimizer step count passes a multiple of this
            (flow_grpo: 8). At most one update per training batch.
        start_step: until this many optimizer steps the shadow copies the weights; the warm-up counts from here.
        warmup: use ``min(decay, (1 + n) / (10 + n))`` as flow_grpo does, so early updates follow the weights.
        apply_at_end: copy the average into the weights when training ends (as Lightning's ``WeightAveraging``), so
            what runs after ``fit`` (``RunSummary``'s evaluation, exports, checkpoints saved later) uses it.
        adapter: average only this LoRA adapter of the policy (a method training several, e.g. TDM-R1's generator);
            None: every trained parameter.

    Raises:
        ValueError: an option out of range, naming the option and a valid value.
    """

    def __init__(self, decay: float = 0.9, every_n_steps: int = 1, start_step: int = 0, warmup: bool = True,
                 apply_at_end: bool = True, adapter: Optional[str] = None):
        problems = []
        if not 0.0 < decay < 1.0:
            problems.append(f"decay={decay} must lie in (0, 1): the weight kept from the average at each update "
                            "(flow_grpo: decay=0.9; drop the callback for no averaging)")
        if every_n_steps < 1:
            problems.append(f"every_n_steps={every_n_steps} must be >= 1 (1: after every optimizer step)")
        if start_step < 0:
            problems.append(f"start_step={start_step} must be >= 0 (0: average from the first step)")
        if problems:
            raise ValueError("EMA: " + "; ".join(problems))
        self.decay, self.every_n_steps, self.start_step = decay, every_n_steps, start_step
        self.warmup, self.apply_at_end, self.adapter = warmup, apply_at_end, adapter
        self.shadow: Optional[dict[str, Tensor]] = None  # name -> float32 average, on the parameter's device
        self.num_updates = 0
        self._last_step = 0  # optimizer steps at the last update or copy
        self._loaded: Optional[dict[str, Any]] = None  # a checkpoint's state, applied once the weights are placed
        self._params: list[tuple[str, nn.Parameter]] = []
        self._live: Optional[list[Tensor]] = None  # the trained weights while the average is swapped in

    @property
    def state_key(self) -> str:
        by_adapter = {"adapter": self.adapter} if self.adapter is not None else {}  # two averages can coexist
        return self._generate_state_key(decay=self.decay, every_n_steps=self.every_n_steps, **by_adapter)

    def on_train_start(self, trainer, pl_module) -> None:
        # here, not in setup or on_fit_start: the module is on its device and a checkpoint's weights and step count
        # are restored (the step count after on_fit_start)
        self._params = trainable_parameters(pl_module, self.adapter)
        if not self._params:
            raise ValueError("EMA: the module has no trainable parameters to average; remove the EMA callback")
        self.shadow = {name: p.detach().to(torch.float32, copy=True) for name, p in self._params}
        self._last_step = trainer.global_step
        if self._loaded is not None:
            self._apply_loaded()

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.shadow is None or step == self._last_step:
            return
        shadow = list(self.shadow.values())
        live = [p.detach().to(torch.float32) for _, p in self._params]
        if step < self.start_step:
            _copy_(shadow, live)
        elif step // self.every_n_steps > self._last_step // self.every_n_steps:
            decay = ema_decay(self.decay, step - self.start_step, self.warmup)
            torch._foreach_lerp_(shadow, live, 1.0 - decay)
            self.num_updates += 1
        else:
            return
        self._last_step = step

    @torch.no_grad()
    def swap_in(self) -> None:
        """Put the average into the weights, keeping the trained weights aside (exactly) for :meth:`swap_out`."""
        if self.shadow is None or self._live is not None:
            return
        params = [p for _, p in self._params]
        self._live = [p.detach().clone() for p in params]
        _copy_(params, list(self.shadow.values()))

    @torch.no_grad()
    def swap_out(self) -> None:
        """Put the trained weights back, bit for bit."""
        if self._live is None:
            return
        _copy_([p for _, p in self._params], self._live)
        self._live = None

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.swap_in()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self.swap_out()

    @torch.no_grad()
    def on_train_end(self, trainer, pl_module) -> None:
        self.swap_out()
        if self.apply_at_end and self.shadow is not None:
            _copy_([p for _, p in self._params], list(self.shadow.values()))

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        if self._live is not None:  # saved while the average is swapped in: the module entry keeps the trained weights
            for (name, _), live in zip(self._params, self._live):
                checkpoint["state_dict"][name] = live.clone()

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("callbacks", {})
        if self.state_key not in saved:
            found = [key for key in saved if key.startswith("EMA")]
            rank_zero_warn(f"EMA: the checkpoint holds no state for {self.state_key} (found {found or 'none'}); the "
                           "average restarts from the restored weights. Resume with the run's decay and "
                           "every_n_steps to continue its average.")

    def state_dict(self) -> dict[str, Any]:
        if self.shadow is None:
            return {}
        return {"shadow": self.shadow, "num_updates": self.num_updates, "last_step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        self._loaded = state_dict
        if self.shadow is not None:  # loaded after on_train_start
            self._apply_loaded()

    def _apply_loaded(self) -> None:
        state, self._loaded = self._loaded, None
        saved = state["shadow"]
        if set(saved) != set(self.shadow) or any(saved[k].shape != v.shape for k, v in self.shadow.items()):
            differ = sorted(set(saved) ^ set(self.shadow))[:3]
            raise ValueError(f"EMA: the checkpoint's average does not match this module's trainable parameters "
                             f"(e.g. {differ or 'shapes'}); resume with the run's policy and LoRA settings")
        with torch.no_grad():
            for name, value in self.shadow.items():
                average = saved[name]
                if isinstance(value, DTensor) and not isinstance(average, DTensor):  # a whole average, resumed sharded
                    average = distribute_tensor(average.to(value.device), value.device_mesh, value.placements)
                value.copy_(average)
        self.num_updates, self._last_step = state["num_updates"], state["last_step"]

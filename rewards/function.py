"""Any Python callable as a reward, named by its dotted path in YAML.

    trainer:
      callbacks:
        - class_path: flowrl.rewards.FunctionReward
          init_args: {function: mypkg.rewards.brightness, options: {gamma: 2.2}, weight: 0.5}

The callable is ``fn(images [B, 3, H, W] in [0, 1], prompts [B], metadata, **options)`` and returns ``B`` scores
(a tensor, a list or a NumPy array of numbers; anything else raises ``RewardOutputError`` naming the reward and what
it returned). It is imported, and ``options`` checked against its signature, when the callback is built, so a typo
fails before any weights load.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any, Callable, Optional

from torch import Tensor

from flowrl.rewards.base import RewardCallback, to_scores
from flowrl.rewards.video_frames import DEFAULT_FRAMES, FrameSpec


def import_callable(path: str) -> Callable:
    """The callable at ``path`` (``package.module.function``; nested attributes allowed after the module).

    >>> import_callable("math.hypot")(3, 4)
    5.0

    Raises:
        ValueError: not a dotted path. ImportError: no importable module on the path, or no callable at its end.
    """
    parts = path.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ValueError(f"function={path!r} must be a dotted path such as mypkg.rewards.brightness")
    for split in range(len(parts) - 1, 0, -1):  # the longest importable module prefix
        module_name = ".".join(parts[:split])
        try:
            target = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and not module_name.startswith(err.name):
                raise  # the module exists but one of its own imports is missing: that error is the useful one
            continue
        module = target
        for attribute in parts[split:]:
            target = getattr(target, attribute, None)
        if not callable(target):
            near = difflib.get_close_matches(parts[split], [n for n in dir(module) if not n.startswith("_")], n=1)
            raise ImportError(f"function={path!r}: module {module_name!r} has no callable "
                              f"{'.'.join(parts[split:])!r}" + (f"; did you mean {module_name}.{near[0]}?" if near
                                                                 else ""))
        return target
    raise ImportError(f"function={path!r}: no module of that path can be imported; install its package or add it "
                      f"to PYTHONPATH")


def options_problem(function: Callable, options: dict[str, Any]) -> Optional[str]:
    """Why ``function(images, prompts, metadata, **options)`` cannot be called (None: it can, or it has no signature
    to check, as some builtins)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(None, None, None, **options)
    except TypeError as err:
        return f"{signature} cannot take (images, prompts, metadata, **{options}): {err}"
    return None


class FunctionReward(RewardCallback):
    """Scores from ``function(images, prompts, metadata, **options)``.

    Args:
        function: dotted path of the callable, e.g. ``mypkg.rewards.brightness``.
        options: keyword arguments passed through to every call.
        weight, name, batch_size, frames, frame_reduction: as :class:`~flowrl.rewards.RewardCallback`; ``name``
            defaults to the function's.

    Raises:
        ImportError, ValueError: the path does not import, or ``options`` do not fit the function's signature.
    """

    default_name = "function"

    def __init__(self, function: str, options: Optional[dict[str, Any]] = None, weight: float = 1.0,
                 name: Optional[str] = None, batch_size: int = 64, frames: FrameSpec = DEFAULT_FRAMES,
                 frame_reduction: str = "mean"):
        super().__init__(weight, name or function.rpartition(".")[2], batch_size, frames, frame_reduction)
        self.function_path, self.options = function, dict(options or {})
        self.function = import_callable(function)
        if problem := options_problem(self.function, self.options):
            raise ValueError(f"FunctionReward {self.name!r}: {function}{problem}")

    @classmethod
    def config_problems(cls, init_args: dict[str, Any]) -> list[str]:
        """The path that does not import and the options the function cannot take, from the parsed ``init_args``:
        one line each, before any callback (or weight) is built."""
        path, options = init_args.get("function"), dict(init_args.get("options") or {})
        where = "trainer.callbacks: FunctionReward"
        try:
            function = import_callable(str(path))
        except (ImportError, ValueError) as err:
            return [f"{where} {err}"]
        problem = options_problem(function, options)
        return [f"{where} function={path!r}{problem}; fix init_args.options"] if problem else []

    def _score(self, images: Tensor, prompts: list[str], metadata: dict[str, Any]) -> Tensor:
        out = self.function(images, prompts, metadata, **self.options)
        return to_scores(out, len(prompts), f"FunctionReward {self.name!r}: {self.function_path}").cpu()

"""``python -m flowrl export --ckpt CKPT --out DIR``: a trained policy for the plain diffusers pipeline.

LoRA runs write ``DIR/pytorch_lora_weights.safetensors`` with the pipeline's own ``save_lora_weights`` (rank and
alpha in its metadata), loadable with ``pipe.load_lora_weights(DIR)``; Wan 2.2's low-noise expert goes to
``DIR/pytorch_lora_weights_transformer_2.safetensors``, loaded with ``pipe.load_lora_weights(DIR, weight_name=...,
load_into_transformer_2=True)``. ``--merged`` also writes the whole pipeline with the adapters fused into the
transformer to ``DIR/merged``. Full fine-tuning runs write the whole pipeline to ``DIR``. The policy is rebuilt from
the run's ``config.yaml`` or ``--config`` and the checkpoint's weights (:func:`flowrl.checkpoints.loading.load_policy`);
the files are written by :mod:`flowrl.policies.export`. An export into a folder holding an earlier one leaves exactly
its own files there (:mod:`flowrl.policies.export_folder`); ``--out`` an existing file is refused before anything
loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from flowrl.checkpoints.loading import load_policy
from flowrl.policies.export import export_lora, export_pipeline
from flowrl.policies.export_folder import out_problem


def parser() -> argparse.ArgumentParser:
    """The options of ``python -m flowrl export``."""
    p = argparse.ArgumentParser(prog="python -m flowrl export", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="a checkpoint of a fit run (a file, a sharded checkpoint's folder "
                   "from --trainer.strategy=fsdp2, or the run's folder: its last.ckpt)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--config", help="the run's config (default: config.yaml saved beside the checkpoints)")
    p.add_argument("--merged", action="store_true", help="also write the pipeline with LoRA fused, to OUT/merged")
    p.add_argument("--ema", action="store_true", help="export the flowrl.callbacks.EMA average of the weights")
    p.add_argument("--adapter", help="the LoRA adapter to export (default: the policy's one trained adapter)")
    return p


def main(args: Optional[list[str]] = None) -> None:
    """Runs ``python -m flowrl export`` with ``args`` (default: the command line).

    Raises:
        SystemExit: one line naming the option and the fix (a bad ``--out``, a checkpoint that is missing or does
            not fit its config), before any weight loads where it can be known then.
    """
    opts = parser().parse_args(args)
    try:
        if problem := out_problem(opts.out):  # before the weights load; never a "-> FILE" that wrote nothing
            raise ValueError(problem)
        policy = load_policy(opts.ckpt, opts.config, opts.ema)
        out = Path(opts.out)
        if not policy.adapter_names:
            print(f"flowrl export: full pipeline -> {export_pipeline(policy, out)}")
            return
        keep = ("merged",) if opts.merged else ()  # written next, whole
        print(f"flowrl export: LoRA weights -> {export_lora(policy, out, opts.adapter, keep)}")
        if opts.merged:
            print(f"flowrl export: merged pipeline -> {export_pipeline(policy, out / 'merged', opts.adapter)}")
    except (ValueError, FileNotFoundError) as err:  # one line naming the option and the fix, not a traceback
        raise SystemExit(f"flowrl export: {err}") from None

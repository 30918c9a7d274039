"""``python -m flowrl predict``: images from a trained run for new prompts, in the options a user reaches for.

The short options are written out as LightningCLI ``predict`` arguments, so everything else about the run
(the method, the policy, the reward callbacks that score the images, devices and precision) comes from the run's
config and every LightningCLI option still applies (``--trainer.accelerator=cuda``,
``--trainer.precision=bf16-mixed``, ``--print_config``):

    python -m flowrl predict --ckpt_path runs/quickstart/version_0/checkpoints/last.ckpt \\
        --prompts "red 3 and blue 7" "green 1 and yellow 4" --seeds 0 1 2 3

The images are :meth:`flowrl.methods.BaseModule.generate`'s (the deterministic sampler from each seed: the
pipeline's solver, see :meth:`~flowrl.methods.generation.Generation.final_latents`) and are written by
:class:`flowrl.callbacks.ImageWriter`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flowrl.checkpoints.paths import checkpoint_problems, resolve_checkpoint, run_config
from flowrl.checkpoints.sharded import is_sharded_checkpoint
from flowrl.output_dirs import unwritable

DESCRIPTION = ("Generate images from a trained run (a fit checkpoint, an exported LoRA folder, or the base model of "
               "a config) and score them with the run's reward callbacks.")
EPILOG = ("Every other option is LightningCLI's `predict` option and is passed on, e.g. --trainer.accelerator=cuda "
          "--trainer.precision=bf16-mixed; add --print_config to see the resolved config.")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flowrl predict", description=DESCRIPTION, epilog=EPILOG,
                                allow_abbrev=False)
    p.add_argument("--ckpt_path", help="a checkpoint of a fit run; its config.yaml is read from the run's folder")
    p.add_argument("--config", action="append", default=[],
                   help="a fit config (default: the config.yaml saved with --ckpt_path's run); without --ckpt_path "
                        "and --lora: the config's base model")
    p.add_argument("--ema", action="store_true", help="draw with the flowrl.callbacks.EMA average kept in --ckpt_path "
                   "(default: the trained weights)")
    p.add_argument("--lora", help="a folder written by `python -m flowrl export` (needs --config, not --ckpt_path)")
    p.add_argument("--prompts", nargs="+", help="prompts (default: the config's validation prompts)")
    p.add_argument("--prompt_file", help="a .txt (one prompt per line) or .jsonl ({\"prompt\": ...}) file")
    p.add_argument("--seeds", nargs="+", type=int, help="one image per prompt and seed (default: 0 1 2 3)")
    p.add_argument("--num_steps", type=int, help="ODE steps (default: the config's model.eval_num_steps)")
    p.add_argument("--guidance_scale", type=float, help="classifier-free guidance (default: the config's)")
    p.add_argument("--batch_size", type=int, help="images per model call (default: the config's data.val_batch_size)")
    p.add_argument("--out", help="output folder (default: <run>/predictions/<n>)")
    return p


def predict_arguments(args: list[str]) -> list[str]:
    """LightningCLI ``predict`` arguments for the short options in ``args`` (the others pass on unchanged).

    Raises:
        SystemExit: every problem with the options at once, naming the option and the fix.

    >>> predict_arguments(["--config", "c.yaml", "--prompts", "a cat", "--seeds", "3", "--num_steps", "20"])
    ['predict', '--config', 'c.yaml', '--data.predict_prompts', '["a cat"]', '--data.predict_seeds', '[3]', \
'--model.init_args.eval_num_steps', '20', '--trainer.devices=1', '--trainer.num_nodes=1', '--trainer.strategy=auto', \
'--return_predictions', 'false']
    """
    opts, rest = parser().parse_known_args(args)
    problems, configs = [], list(opts.config)
    ckpt = resolve_checkpoint(opts.ckpt_path) if opts.ckpt_path else None  # a run's folder: its last.ckpt
    if opts.ckpt_path and (wrong := checkpoint_problems(opts.ckpt_path)):  # first: a config found is no use then
        problems += [w.replace("ckpt_path=", "--ckpt_path ", 1).replace("leave ckpt_path out", "leave it out")
                     for w in wrong]
    elif ckpt is not None and not configs:
        found = run_config(ckpt)
        if found is None:
            problems.append(f"--ckpt_path {opts.ckpt_path}: no config.yaml beside it or in its run folder; pass the "
                            "run's config with --config")
        configs = [str(found)] if found else []
    if not configs and not opts.ckpt_path:
        problems.append("give --ckpt_path (a fit run's checkpoint) or --config (a fit config: its base model, or "
                        "with --lora an exported LoRA folder)")
    if opts.lora and opts.ckpt_path:
        problems.append("--lora and --ckpt_path are two ways to give trained weights; pass one of them")
    if opts.lora and not (Path(opts.lora).expanduser() / "pytorch_lora_weights.safetensors").is_file():
        problems.append(f"--lora {opts.lora}: no pytorch_lora_weights.safetensors there; pass a folder written by "
                        "`python -m flowrl export --ckpt CKPT --out FOLDER`")
    if opts.ema and ckpt is not None and not checkpoint_problems(opts.ckpt_path):
        from flowrl.checkpoints.loading import ema_problem  # torch and the policies: only when --ema asks

        if why := ema_problem(ckpt):
            problems.append(f"--ema: {why}")
    if opts.ema and not opts.ckpt_path:
        problems.append("--ema reads the average a fit checkpoint keeps; give --ckpt_path (for an exported LoRA "
                        "folder: `python -m flowrl export --ema`, then --lora)")
    if opts.prompts and opts.prompt_file:
        problems.append("--prompts and --prompt_file are alternatives; pass one of them")
    if opts.prompt_file and not Path(opts.prompt_file).expanduser().is_file():
        problems.append(f"--prompt_file {opts.prompt_file} does not exist")
    for name in ("num_steps", "batch_size"):
        if getattr(opts, name) is not None and getattr(opts, name) < 1:
            problems.append(f"--{name} {getattr(opts, name)}: must be at least 1")
    if bad := [s for s in opts.seeds or [] if not 0 <= s < 2**63]:
        problems.append(f"--seeds {' '.join(map(str, bad))}: a seed must be in [0, 2**63) (a 64-bit generator "
                        "seed), e.g. --seeds 0 1 2 3")
    if opts.out and (why := unwritable(opts.out, keep=False)):  # ImageWriter makes it once the run starts
        problems.append(f"--out {opts.out} cannot be written ({why}); pick a writable folder")
    if problems:
        raise SystemExit("flowrl predict: invalid options:\n  " + "\n  ".join(problems))
    out = ["predict", *[arg for config in configs for arg in ("--config", config)]]
    if ckpt is not None:
        out += ["--ckpt_path", str(ckpt)]
    if opts.prompts or opts.prompt_file:
        out += ["--data.predict_prompts", json.dumps(opts.prompts) if opts.prompts else opts.prompt_file]
    if opts.seeds:
        out += ["--data.predict_seeds", json.dumps(opts.seeds)]
    if opts.batch_size:
        out += ["--data.val_batch_size", str(opts.batch_size)]
    if opts.num_steps:
        out += ["--model.init_args.eval_num_steps", str(opts.num_steps)]
    if opts.guidance_scale is not None:
        out += ["--model.init_args.guidance_scale", str(opts.guidance_scale)]
    if opts.lora:
        out += ["--trainer.callbacks+=flowrl.callbacks.LoraWeights", f"--trainer.callbacks.folder={opts.lora}"]
    if opts.ema and ckpt is not None:
        out += ["--trainer.callbacks+=flowrl.callbacks.EMAWeights", f"--trainer.callbacks.ckpt={ckpt}"]
    if opts.out:
        out += ["--trainer.callbacks+=flowrl.callbacks.ImageWriter", f"--trainer.callbacks.output_dir={opts.out}"]
    if not any(a.split("=")[0] in ("--trainer.devices", "--trainer.num_nodes", "--trainer.strategy") for a in rest):
        # one process, whatever the run trained on (its config may say 2 devices and fsdp2): ImageWriter writes one
        # folder from one process; a sharded checkpoint loads into FSDP2 on that one process
        sharded = ckpt is not None and is_sharded_checkpoint(ckpt)
        out += ["--trainer.devices=1", "--trainer.num_nodes=1", f"--trainer.strategy={'fsdp2' if sharded else 'auto'}"]
    return [*out, "--return_predictions", "false", *rest]

"""Rewrites of the command line before LightningCLI parses it."""

from __future__ import annotations


def null_overrides_as_configs(args: list[str]) -> list[str]:
    """Rewrites ``--a.init_args.b=null`` (or ``--a.init_args.b null``) into ``--config {a: {init_args: {b: null}}}``
    at the same position, so later arguments still override it.

    >>> null_overrides_as_configs(["fit", "--model.init_args.policy.init_args.lora=null", "--trainer.max_steps=2"])
    ['fit', '--config', '{model: {init_args: {policy: {init_args: {lora: null}}}}}', '--trainer.max_steps=2']
    >>> null_overrides_as_configs(["--model.init_args.beta", "null", "--data.seed=null"])
    ['--config', '{model: {init_args: {beta: null}}}', '--data.seed=null']
    """
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        key, eq, value = arg.partition("=")
        if not eq and i + 1 < len(args):
            value = args[i + 1]
        if key.startswith("--") and ".init_args." in key and value == "null":
            layer = "null"
            for part in reversed(key[2:].split(".")):
                layer = f"{{{part}: {layer}}}"
            out += ["--config", layer]
            i += 1 if eq else 2
            continue
        out.append(arg)
        i += 1
    return out

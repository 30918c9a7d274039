"""``python -m flowrl evaluate``: the base model against tuned models on a prompt suite, paired by (prompt, seed).

One idea per module: :mod:`~flowrl.evaluation.stats` (paired differences, bootstrap intervals over prompts, pure
NumPy), :mod:`~flowrl.evaluation.signals` (drift, diversity and the reward-hacking flag, pure functions),
:mod:`~flowrl.evaluation.suites` (prompt suites and their categories), :mod:`~flowrl.evaluation.sources` and
:mod:`~flowrl.evaluation.metrics` (what the command reads and checks before loading weights),
:mod:`~flowrl.evaluation.models` (LoRA models as adapters on one backbone), :mod:`~flowrl.evaluation.module` (the
``trainer.predict`` module), :mod:`~flowrl.evaluation.results` and :mod:`~flowrl.evaluation.report` (the files),
:mod:`flowrl.cli.evaluate` (the command line). Guide: ``docs/evaluating.md``.
"""

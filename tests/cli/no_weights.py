"""Run ``fit`` up to where training would start, with every weight load refused: the run is built (policy, method,
data module, trainer), every check has passed, and no ``from_pretrained`` of diffusers or transformers, nor a
policy's ``load()``, has run."""

from typing import Any

import pytest


class Built(Exception):
    """Raised where ``fit`` would start: the run is built and every check before loading has passed."""


def refuse_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every weight load fail loudly: diffusers' and transformers' ``from_pretrained`` and ``FlowPolicy.load``."""
    def refuse(*args: Any, **kwargs: Any):
        raise AssertionError("a weight load ran before the checks")

    for target in ("diffusers.ModelMixin.from_pretrained", "diffusers.DiffusionPipeline.from_pretrained",
                   "transformers.PreTrainedModel.from_pretrained"):
        monkeypatch.setattr(target, classmethod(refuse))
    monkeypatch.setattr("flowrl.policies.base.FlowPolicy.load", refuse)


def stop_when_built(monkeypatch: pytest.MonkeyPatch, seen: dict) -> None:
    """Refuse weights (:func:`refuse_weights`) and raise :class:`Built` where ``fit`` would start, keeping the CLI
    in ``seen["cli"]``."""
    from flowrl.cli import FlowRLCLI

    refuse_weights(monkeypatch)

    def built(self):
        seen["cli"] = self
        raise Built

    monkeypatch.setattr(FlowRLCLI, "before_fit", built)

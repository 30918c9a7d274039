"""The command line's parser, which writes out the config it parsed without validating it a second time.

A fit dumps its parsed config twice: for the method's hyperparameters (LightningCLI's ``_dump_config``, kept in the
checkpoint) and to ``config.yaml`` in the run's folder (:class:`~lightning.pytorch.cli.SaveConfigCallback`).
jsonargparse validates the config on each dump, as the parse already did: on a tiny fit the two repeats cost a sixth
of its CPU time. The output is the same text; any other config (``--print_config``'s, which is dumped before the
parse validates, or one a caller built) is validated as before.
"""

from __future__ import annotations

from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser


class ParsedConfigParser(LightningArgumentParser):
    """:class:`~lightning.pytorch.cli.LightningArgumentParser` whose ``dump`` and ``save`` of :attr:`validated` (the
    config its parse returned and validated, set by the CLI) skip the second validation, unless the caller asks for
    it (``skip_validation=False`` given to ``dump``)."""

    #: the namespace the parse validated (the very object: any other, a copy included, is validated as usual)
    validated: Namespace | None = None

    def dump(self, namespace: Namespace, *args: Any, **kwargs: Any) -> str:
        """jsonargparse's ``dump``; without its validation for :attr:`validated`."""
        if namespace is not None and namespace is self.validated:
            kwargs.setdefault("skip_validation", True)
        return super().dump(namespace, *args, **kwargs)

    def save(self, namespace: Namespace, *args: Any, **kwargs: Any) -> None:
        """jsonargparse's ``save``; without its validation for :attr:`validated`."""
        if namespace is not None and namespace is self.validated:
            kwargs.setdefault("skip_validation", True)
        return super().save(namespace, *args, **kwargs)

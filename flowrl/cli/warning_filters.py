"""Framework notices a flowrl user cannot act on, filtered narrowly so that the console shows the run.

Each filter names one message and says why hiding it loses nothing; every other warning (flowrl's own, and
Lightning's about a user's settings) still shows. :mod:`flowrl.cli` imports this module before anything that
imports diffusers, so the filters are in place for ``python -m flowrl`` from the first line on (and on every rank:
DDP starts each rank with the same command). ``tests/cli/test_console.py`` runs the quickstart and finds no
warning on its console.
"""

from __future__ import annotations

import logging
import warnings

# Lightning 2.6's own pytree helper (lightning/pytorch/utilities/_pytree.py) still builds torch's LeafSpec, which
# torch 2.13 deprecates: Lightning's code, nothing in a user's config or in flowrl calls it.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
# Lightning's all_gather (our gathers under DDP) goes through torch.distributed.nn.functional.all_gather, deprecated
# in torch 2.13; Lightning's to change, and the gathered values are what they were.
warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated",
                        category=FutureWarning)
# "Found N module(s) in eval mode at the start of training": frozen text encoders, VAEs and a full fine-tuning run's
# reference copy stay in eval mode on purpose. flowrl.callbacks.RunHeader says so in one line and warns itself when a
# module that holds trained parameters is in eval mode, which is the case Lightning's warning is for.
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")


class DropMessages(logging.Filter):
    """Drops the log records whose message starts with one of ``prefixes`` or contains one of ``fragments``."""

    def __init__(self, prefixes: tuple[str, ...] = (), fragments: tuple[str, ...] = ()):
        super().__init__()
        self.prefixes, self.fragments = prefixes, fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(self.prefixes) or any(f in message for f in self.fragments))


# transformers (5.x) says it falls back to its PIL image processors when torchvision is absent, as soon as diffusers'
# SD3 / FLUX pipeline modules import CLIPImageProcessor and SiglipImageProcessor (for IP-Adapters, which flowrl never
# runs). flowrl's CLIP rewards preprocess in torch and match the PIL processors; torchvision is not a dependency.
logging.getLogger("transformers.utils.import_utils").addFilter(
    DropMessages(fragments=("requires torchvision (not installed); falling back to",)))
# Lightning advertises its hosted logger and checkpoint store ("💡 Tip: ...") at every start: not about the run.
for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
    logging.getLogger(_name).addFilter(DropMessages(prefixes=("💡 Tip:",)))
# On SIGTERM, Lightning logs "Received SIGTERM: 15" on every rank and ModelCheckpoint "An SIGTERMException was raised
# with message: , saved checkpoint to ..." (its own save on exception): flowrl.callbacks.SigtermStop says both once,
# with the step, the checkpoint to resume from and the exit status.
logging.getLogger("lightning.pytorch.trainer.connectors.signal_connector").addFilter(
    DropMessages(fragments=("Received SIGTERM:",)))
for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
    logging.getLogger(_name).addFilter(DropMessages(prefixes=("An SIGTERMException was raised",)))

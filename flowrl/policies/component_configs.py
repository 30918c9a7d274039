"""A component's config read from its folder without its weights: what a policy knows before :meth:`load`.

``load_config`` returns the file as written; ``from_pretrained`` builds the model from the file's values over the
class's ``__init__`` defaults. :func:`component_config` gives the same values, so a policy reads ``in_channels``,
``patch_size`` or ``guidance_embeds`` from it exactly as from the loaded model's ``config``.
"""

from __future__ import annotations

import inspect

from diffusers.configuration_utils import FrozenDict


def component_config(cls: type, path: str, subfolder: str, **kwargs) -> FrozenDict:
    """The config of the diffusers model class ``cls`` in ``path/subfolder``: its ``__init__`` defaults updated by
    the file's values, with attribute access as ``model.config``."""
    defaults = {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return FrozenDict({**defaults, **cls.load_config(path, subfolder=subfolder, **kwargs)})

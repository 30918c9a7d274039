"""When a method's options are checked: once the most derived ``__init__`` has returned (:class:`CheckedOnBuild`)."""

from __future__ import annotations

from typing import Any


class CheckedOnBuild(type):
    """Checks a method's options once its most derived ``__init__`` has returned (every class has set its options as
    attributes by then, and no weight has loaded: weights load in ``configure_model``). A class cannot do it at the end
    of its own ``__init__``, which a subclass's runs around; jsonargparse still reads each ``__init__``'s signature."""

    def __call__(cls, *args: Any, **kwargs: Any):
        module = super().__call__(*args, **kwargs)
        module.check()
        return module

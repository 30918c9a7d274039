"""Where a model name points: a hub id, a local folder, or a model embedded in the flowrl package.

Embedded models are addressed as ``flowrl/<name>`` and resolve to ``flowrl/assets/<name>``; everything else is
passed to ``from_pretrained`` unchanged, so one loading path serves all three.
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_PREFIX = "flowrl/"


def resolve_model(name_or_path: str) -> str:
    """The ``from_pretrained`` argument for ``name_or_path``.

    Raises:
        FileNotFoundError: an embedded name that is not shipped, or a path that looks local and is missing.
    """
    if name_or_path.startswith(EMBEDDED_PREFIX):
        path = ASSETS / name_or_path[len(EMBEDDED_PREFIX):]
        if not path.is_dir():
            shipped = sorted(p.name for p in ASSETS.iterdir()) if ASSETS.is_dir() else []
            raise FileNotFoundError(f"embedded model {name_or_path!r} is not shipped; embedded models: {shipped}")
        return str(path)
    local = Path(name_or_path).expanduser()
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1
    if looks_local and not local.exists():
        raise FileNotFoundError(
            f"model path {name_or_path!r} does not exist; pass an existing folder, a hub id 'org/name', "
            f"or an embedded model such as 'flowrl/tiny-digits'")
    return str(local) if local.exists() else name_or_path

"""Where a model name points: a hub id, a local folder, or a model embedded in the flowrl package.

Embedded models are addressed as ``flowrl/<name>`` and resolve to ``flowrl/assets/<name>``; everything else is
passed to ``from_pretrained`` unchanged, so one loading path serves all three.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator
from unittest import mock

ASSETS = Path(__file__).resolve().parent / "assets"
EMBEDDED_PREFIX = "flowrl/"
#: where a ``fit`` config names its model
MODEL_KEY = "model.init_args.policy.init_args.model"


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


def model_problems(name_or_path: str, key: str) -> list[str]:
    """Why ``name_or_path`` cannot load, found without loading it: a missing embedded model or local folder, or a
    hub id that is neither in the local cache nor reachable (one quick request, no retries), each naming ``key``.

    >>> model_problems("flowrl/tiny-digits", "model.init_args.policy.init_args.model")
    []
    >>> model_problems("./no/such/folder", "model")  # doctest: +ELLIPSIS
    ["model='./no/such/folder': model path './no/such/folder' does not exist; ..."]
    """
    try:
        resolved = resolve_model(name_or_path)
    except FileNotFoundError as err:
        return [f"{key}={name_or_path!r}: {err}"]
    if Path(resolved).exists():
        return []
    return hub_problems(resolved, key)


def hub_problems(repo_id: str, key: str, timeout: float = 10.0) -> list[str]:
    """Problems reaching hub model ``repo_id`` when it is not in the local cache (empty when it is cached)."""
    from huggingface_hub import constants, model_info, snapshot_download

    try:
        snapshot_download(repo_id, local_files_only=True)
        return []  # cached: from_pretrained will not need the network
    except Exception:  # noqa: BLE001  any miss: not cached (or cached partly), so the network decides
        pass
    fix = (f"download it where there is network (`hf download {repo_id}`, into HF_HOME={constants.HF_HOME}) or "
           "pass a local folder")
    if constants.HF_HUB_OFFLINE:
        return [f"{key}={repo_id!r} is not in the local hub cache and HF_HUB_OFFLINE is set; {fix}"]
    try:
        model_info(repo_id, timeout=timeout)
    except Exception as err:  # noqa: BLE001  connection errors, 401 (gated), 404: all mean it will not load
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        endpoint = os.environ.get("HF_ENDPOINT", constants.ENDPOINT)
        return [f"{key}={repo_id!r}: the hub ({endpoint}) did not give this model ({type(err).__name__}: "
                f"{reason[:300]}) and it is not in the local cache; {fix}"]
    return []


@contextmanager
def cache_only(active: bool = True) -> Iterator[None]:
    """Within it (when ``active``), hub reads come from the local cache alone, as under ``HF_HUB_OFFLINE=1``.

    For building a run whose model :func:`model_problems` already refused: the policy reads its configs where the
    weights would come from, and the hub client retries a refused connection for about 25 s (five backoffs) before
    failing the way the quick check already said.
    """
    from huggingface_hub import constants

    with mock.patch.object(constants, "HF_HUB_OFFLINE", True) if active else nullcontext():
        yield

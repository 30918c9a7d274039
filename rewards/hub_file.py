"""Where a single weights file points: a local file, or ``org/repo/path/in/repo`` on the Hugging Face hub.

Some reward heads are published as one file rather than a ``from_pretrained`` folder (the LAION aesthetic MLP, the
HPSv2 open_clip checkpoints). ``check_file`` runs at construction so a missing local file fails at config time;
``fetch_file`` downloads (once, into the hub cache) when the weights load.
"""

from __future__ import annotations

from pathlib import Path


def _hub_parts(spec: str) -> tuple[str, str] | None:
    if spec.startswith((".", "/", "~")) or Path(spec).expanduser().exists() or spec.count("/") < 2:
        return None
    org, repo, filename = spec.split("/", 2)
    return f"{org}/{repo}", filename


def check_file(spec: str) -> str:
    """``spec`` unchanged when it is an existing local file or a hub file address.

    Raises:
        FileNotFoundError: a local-looking path that does not exist, naming both accepted forms.
    """
    if _hub_parts(spec) is None and not Path(spec).expanduser().is_file():
        raise FileNotFoundError(f"weights file {spec!r} does not exist; pass a local file or a hub address "
                                f"'org/repo/filename' (e.g. 'xswu/HPSv2/HPS_v2.1_compressed.pt')")
    return spec


def fetch_file(spec: str) -> str:
    """A local path for ``spec``: the file itself, or the hub file downloaded into the huggingface_hub cache."""
    parts = _hub_parts(check_file(spec))
    if parts is None:
        return str(Path(spec).expanduser())
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo_id=parts[0], filename=parts[1])

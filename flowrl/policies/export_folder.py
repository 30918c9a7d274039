"""The folder an export writes: exactly this export's files, whatever an earlier export left there.

An export is written into a fresh folder beside ``--out`` first and moved in only once it is whole (a failed export
leaves the earlier one as it was). Moving it in removes, and names, every file an earlier export wrote there that
this one does not write: a second expert's ``pytorch_lora_weights_transformer_2.safetensors`` beside a new
one-expert export would otherwise be loaded into ``transformer_2`` by the Video page's load snippet. Files no export
writes (a README, the user's own notes) are left alone.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from flowrl.output_dirs import unwritable

LORA_FILES = "pytorch_lora_weights*.safetensors"


def out_problem(out: str | Path) -> Optional[str]:
    """Why ``--out`` cannot take an export (None if it can), checked before any weight loads; makes no folder."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        return (f"--out {out} is a file, not a folder: an export writes a folder ({LORA_FILES.replace('*', '')}, or "
                "a whole pipeline); give a folder's path (it is created), or remove the file")
    if why := unwritable(str(out), keep=False):
        return f"--out {out} cannot be written ({why}); pick a writable folder"
    return None


def exported_entries(folder: Path, pipeline: bool) -> list[Path]:
    """What an export wrote in ``folder``: LoRA files, a ``merged`` pipeline, and (``pipeline``: this export writes
    one there) a pipeline's ``model_index.json`` with the component folders it names. A LoRA export leaves a
    pipeline at the top of ``folder`` alone: it may be a model folder given as ``--out`` by mistake."""
    found = sorted(folder.glob(LORA_FILES))
    if (folder / "merged" / "model_index.json").is_file():
        found.append(folder / "merged")
    index = folder / "model_index.json"
    if pipeline and index.is_file():
        try:
            components = [name for name, value in json.loads(index.read_text()).items()
                          if not name.startswith("_") and isinstance(value, list) and value and value[0] is not None]
        except (ValueError, AttributeError):  # not a pipeline's index: its folders are not known to be ours
            components = []
        found += [folder / name for name in components if (folder / name).is_dir()] + [index]
    return found


@contextmanager
def staged(out: str | Path, keep: tuple[str, ...] = (), pipeline: bool = False) -> Iterator[Path]:
    """A fresh folder to write an export into; on success its entries replace ``out``'s, and what an earlier export
    left in ``out`` that this one did not write is removed and named (``keep``: names a later step of the same
    command writes; ``pipeline``: this export is a whole pipeline). On an error ``out`` is untouched and the staging
    folder removed.

    Raises:
        ValueError: ``out`` is a file or cannot be written.
    """
    out = Path(out)
    if problem := out_problem(out):
        raise ValueError(problem)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f".{out.name}.export-partial"
    shutil.rmtree(stage, ignore_errors=True)  # a partial export of a run that was killed
    stage.mkdir()
    try:
        yield stage
        out.mkdir(exist_ok=True)
        written = {p.name for p in stage.iterdir()}
        for old in exported_entries(out, pipeline):
            if old.name not in written and old.name not in keep:
                _remove(old)
                print(f"flowrl export: removed {old} (an earlier export's; this export does not write it)", flush=True)
        for new in sorted(stage.iterdir()):
            target = out / new.name
            if target.is_dir() and not target.is_symlink():
                _remove(target)
            os.replace(new, target)  # a file: atomic, never half the old and half the new
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()

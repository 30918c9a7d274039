"""A griffe extension for the API reference: flowrl installs ``rewards/`` and ``callbacks/`` as ``flowrl.rewards`` and
``flowrl.callbacks`` (setuptools ``package-dir``), which griffe's static finder cannot map; this loads each folder as a
subpackage of ``flowrl`` so that ``::: flowrl.rewards`` and cross-references into it resolve."""

from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("rewards", "callbacks")


class PackageDirs(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        if pkg.name != "flowrl":
            return
        for name in PACKAGE_DIRS:
            if name not in pkg.members:
                pkg.set_member(name, loader._load_module(name, ROOT / name / "__init__.py", parent=pkg))

"""Runs a method with LoRA weights exported by ``python -m flowrl export`` (``python -m flowrl predict --lora DIR``).

The policy is built from a fit config as usual; at ``setup`` the folder's weights are loaded onto its denoiser as
one more adapter, which becomes the active one (``flowrl.policies.export.load_lora``: rank and alpha come from the
file). For ``predict`` and ``validate``; a checkpoint (``--ckpt_path``) is the other way to give trained weights.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Callback


class LoraWeights(Callback):
    """Args:
        folder: a folder with ``pytorch_lora_weights.safetensors`` (``python -m flowrl export --out FOLDER``).
        adapter: the name the loaded adapter gets on the policy.
    """

    def __init__(self, folder: str, adapter: str = "exported"):
        if not (Path(folder).expanduser() / "pytorch_lora_weights.safetensors").is_file():
            raise FileNotFoundError(f"LoraWeights: {folder}/pytorch_lora_weights.safetensors does not exist; pass a "
                                    "folder written by `python -m flowrl export --ckpt CKPT --out FOLDER`")
        self.folder, self.adapter = str(Path(folder).expanduser()), adapter

    def setup(self, trainer, pl_module, stage: str) -> None:
        from flowrl.policies.export import load_lora  # the policies import diffusers; this package does not

        pl_module.load_weights()  # setup runs before configure_model, which loads them otherwise
        if self.adapter not in pl_module.policy.adapter_names:
            load_lora(pl_module.policy, self.folder, self.adapter)

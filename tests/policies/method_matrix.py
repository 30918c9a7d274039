"""Every method on every family: the tables of the matrix test (``test_every_method.py``) and the tiny ``fit``
config of one (method, family) pair.

A family is a policy class on one of the tiny pipelines of ``conftest.py`` with its CPU-sized options and what the
family needs of any method (SD1.5's DDIM step, a step-distilled model's guidance 1, an edit's prompt records). A
method is its class with options that keep its rollout small (3 steps, trees of 2 branches); every other option is
the method's default. ``REFUSED`` lists the pairs that cannot run, with the words the pre-load check says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from flowrl.config_nodes import class_at
from tests.policies.edit_records import write_records
from tests.policies.tiny_editing import CONDITION_AREA, SOURCE_AREA
from tests.policies.tiny_hunyuan15 import SHORT_TEXT

PROMPTS = ["a red cat", "a blue dog"]


@dataclass(frozen=True)
class Family:
    policy: str  # the adapter's class path
    fixture: str  # the conftest fixture of its tiny pipeline (a folder; wan_dirs: a dict, read at ``key``)
    options: dict  # the policy's CPU-sized init_args
    guidance: float = 2.0  # the sampling guidance of its methods (1: a model without guidance)
    method_options: dict = field(default_factory=dict)  # what every method needs on it
    records: int = 0  # source images per prompt record (0: text prompts)
    key: Optional[str] = None


FAMILIES = {
    "sd3": Family("flowrl.policies.SD3Policy", "sd3_dir", {"resolution": 32, "max_sequence_length": 8}),
    "flux": Family("flowrl.policies.FluxPolicy", "flux_dir", {"resolution": 32, "max_sequence_length": 8}),
    # SD1.5 predicts noise: the policy-gradient methods take the DDIM step, whose eta stays <= 1 (0.9: DenseGRPO's
    # calibration may add; BranchGRPO's split noise at most 1 / 0.9)
    "sd15": Family("flowrl.policies.SD15Policy", "sd15_dir", {"resolution": 32},
                   method_options={"step_kind": "ddim", "noise_level": 0.9, "split_noise_scale": 1.0}),
    "qwen_image": Family("flowrl.policies.QwenImagePolicy", "qwen_image_dir",
                         {"resolution": 32, "max_sequence_length": 16}),
    # Qwen-Image 2.1 samples without guidance by default; its CFG is plain true CFG, exercised here at 2
    "qwen_image21": Family("flowrl.policies.QwenImage21Policy", "qwen_image21_dir", {"resolution": 32}),
    "flux2": Family("flowrl.policies.Flux2Policy", "flux2_dir", {"resolution": 32, "max_sequence_length": 16}),
    # FLUX.2 [klein] step-distilled: no guidance; TDM-R1's CFG terms at 1
    "flux2_distilled": Family("flowrl.policies.Flux2Policy", "flux2_distilled_dir",
                              {"resolution": 32, "max_sequence_length": 16}, guidance=1.0,
                              method_options={"teacher_guidance": 1.0, "surrogate_guidance": 1.0}),
    "flux2_dev": Family("flowrl.policies.Flux2Policy", "flux2_dev_dir", {"resolution": 32, "max_sequence_length": 48}),
    "zimage": Family("flowrl.policies.ZImagePolicy", "zimage_dir", {"resolution": 32, "max_sequence_length": 32}),
    "qwen_edit": Family("flowrl.policies.QwenImageEditPolicy", "qwen_edit_plus_dir",
                        {"resolution": 32, "source_area": SOURCE_AREA, "condition_area": CONDITION_AREA}, records=2),
    "kontext": Family("flowrl.policies.FluxKontextPolicy", "flux_kontext_dir",
                      {"resolution": 32, "source_area": 32 * 32, "max_sequence_length": 16}, records=1),
    "wan": Family("flowrl.policies.WanPolicy", "wan_dirs",
                  {"height": 32, "width": 32, "num_frames": 9, "max_sequence_length": 16}, key="wan21"),
    # Wan 2.1 image-to-video: a first frame per record (its attention splits 512 text tokens off)
    "wan_i2v": Family("flowrl.policies.WanI2VPolicy", "wan_dirs",
                      {"height": 32, "width": 32, "num_frames": 9, "max_sequence_length": 512}, records=1,
                      key="wan21_i2v"),
    # LTX-2 text-to-video: the joint audio-video state (30 fps: 4 audio latent frames, a state of 3088 = 16 x 193)
    "ltx2": Family("flowrl.policies.LTX2Policy", "ltx2_dir",
                   {"height": 32, "width": 32, "num_frames": 5, "frame_rate": 30.0, "max_sequence_length": 16}),
    # LTX-2 image-to-video: a first frame per record, kept out of the state (2 x 16 x 16 x 4 + 16 = 2064 = 16 x 129);
    # no H.264 re-compression (PyAV is not a dependency)
    "ltx2_i2v": Family("flowrl.policies.LTX2I2VPolicy", "ltx2_dir",
                       {"height": 32, "width": 32, "num_frames": 5, "frame_rate": 30.0, "max_sequence_length": 16,
                        "image_crf": 0}, records=1),
    # HunyuanVideo 1.5 (tiny: 12 x 16 px, a bucket of its target size; 5 frames); image-to-video with a first frame
    "hunyuan15": Family("flowrl.policies.HunyuanVideo15Policy", "hunyuan15_dirs",
                        {"height": 12, "width": 16, "num_frames": 5, **SHORT_TEXT}, key="hunyuan15_t2v"),
    "hunyuan15_i2v": Family("flowrl.policies.HunyuanVideo15I2VPolicy", "hunyuan15_dirs",
                            {"height": 12, "width": 16, "num_frames": 5, **SHORT_TEXT}, records=1,
                            key="hunyuan15_i2v"),
}

#: method: (class path, options that keep its rollout small)
METHODS = {
    "flow_grpo": ("flowrl.methods.FlowGRPO", {}),
    "dense_grpo": ("flowrl.methods.DenseGRPO", {"calibration": {"samples": 2, "iterations": 1}}),
    "tp_grpo": ("flowrl.methods.TPGRPO", {"window_size": 2}),
    "tempflow_grpo": ("flowrl.methods.TempFlowGRPO", {"branches": 2}),
    "tree_rpo": ("flowrl.methods.TreeRPO", {"window_size": 2, "branches": 2}),
    "branch_grpo": ("flowrl.methods.BranchGRPO", {"split_steps": [0, 1], "branches": 2}),
    "g2rpo": ("flowrl.methods.G2RPO", {"branches": 2}),
    "diffusion_nft": ("flowrl.methods.DiffusionNFT", {}),
    "tdm_r1": ("flowrl.methods.TDMR1", {"num_steps": 2, "num_train_steps": 1}),
    # Flow-GRPO's step-credit options: MixGRPO's window (with MixGRPO-Flash's solver after it on a flow model, on
    # its compressed tail: after the window [0, 1) of 3 steps, 1 step for 2), GCPO's chunks, Flash-GRPO's one step
    # per group
    "mix_grpo": ("flowrl.methods.FlowGRPO", {"sde_window": 1, "window_shift_every": 1,
                                             "ode_solver_after_window": "dpmsolver++", "tail_compress": 0.4}),
    "gcpo": ("flowrl.methods.FlowGRPO", {"loss": "chunk_gspo", "loss_options": {"chunks": [1, 2]},
                                         "train_chunks": 0.5, "timestep_fraction": 1.0}),
    "flash_grpo": ("flowrl.methods.FlowGRPO", {"flash_pool": [0, 1], "flash_noise": True, "rectify": "batch",
                                               "noise_level": 1.0}),
}
#: the pairs that cannot run, and the words of the pre-load check's reason
REFUSED = {
    ("diffusion_nft", "sd15"): "predicts epsilon: DiffusionNFT's losses need a flow (velocity) model",
    ("tdm_r1", "sd15"): "predicts epsilon: TDM-R1's losses need a flow (velocity) model",
    ("tdm_r1", "flux"): "guidance-distilled",
    ("tdm_r1", "kontext"): "guidance-distilled",
    ("tdm_r1", "flux2_dev"): "guidance-distilled",
    ("mix_grpo", "sd15"): "is the flow (velocity) solver, but the policy predicts epsilon",
    ("flash_grpo", "sd15"): "model.flash_noise=true sets the flow_grpo step's std, not the ddim step's",
}
#: where the step kind is an option of the method, and where guidance options exist (the others would be unknown keys)
POLICY_GRADIENT = {"flow_grpo", "dense_grpo", "tp_grpo", "tempflow_grpo", "tree_rpo", "branch_grpo", "g2rpo", "mix_grpo",
                   "gcpo", "flash_grpo"}
NEW_FAMILIES = ["qwen_image", "qwen_image21", "flux2", "zimage", "qwen_edit", "kontext", "wan"]


def family_options(method: str, family: Family) -> dict[str, Any]:
    """What the family needs of this method, among the options the method has: the step kind where it samples an SDE
    of its choice, BranchGRPO's split noise, TDM-R1's guidance."""
    keep = {"step_kind", "noise_level"} if method in POLICY_GRADIENT else set()
    keep |= {"split_noise_scale"} if method == "branch_grpo" else set()
    keep |= {"teacher_guidance", "surrogate_guidance"} if method == "tdm_r1" else set()
    return {k: v for k, v in family.method_options.items() if k in keep}


def config(method: str, family_name: str, model_dir: str, out: Path) -> dict:
    """The parsed-config dict of a one-batch fit of ``method`` on ``family_name`` (``out``: its folder; the prompt
    records of an editing family are written there)."""
    from flowrl.cli.config_checks import method_without_policy
    from flowrl.methods.option_surface import MethodOptionsError

    family = FAMILIES[family_name]
    path, options = METHODS[method]
    guidance = 1.0 if method in ("tdm_r1", "diffusion_nft") else family.guidance
    init = {"policy": {"class_path": family.policy,
                       "init_args": {"model": model_dir, "lora": {"rank": 4, "alpha": 8}, **family.options}},
            "num_steps": 3, "guidance_scale": guidance, "seed": 3, **options, **family_options(method, family),
            "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 1.0e-2}}}
    if method in POLICY_GRADIENT:
        init.update(micro_batch_size=4, check_ratio=True, check_ratio_threshold=1.0e-4)
    try:  # a refused pair (its problem is what the test reads) scores one sample a rollout, as a trajectory
        leaves = method_without_policy(class_at(path), init).rollout_cost()[0]
    except MethodOptionsError:
        leaves = 1
    prompts = str(write_records(out / "data", sizes=((40, 48), (32, 32)), per_record=family.records)) \
        if family.records else PROMPTS
    # a video's first frame is not an edit's source
    edits = family.records and not any(name in family.policy for name in ("Wan", "HunyuanVideo", "LTX2"))
    reward = ({"class_path": "flowrl.rewards.EditConsistency", "init_args": {"size": 8}} if edits else
              {"class_path": "flowrl.rewards.JpegIncompressibility"})
    return {"seed_everything": 3,
            "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 1, "enable_progress_bar": False,
                        "num_sanity_val_steps": 0, "limit_val_batches": 0, "default_root_dir": str(out),
                        "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                   "init_args": {"save_dir": str(out), "name": "csv"}},
                        "callbacks": [reward]},
            "model": {"class_path": path, "init_args": init},
            "data": {"prompts": prompts, "group_size": max(leaves, 2), "num_groups": 1, "seed": 3}}

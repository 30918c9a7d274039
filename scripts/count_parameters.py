"""Parameter counts of the published models behind docs/models.md's memory arithmetic, on the meta device (no
weights are read or allocated): each transformer, text encoder and VAE built from its published config, and the LoRA
parameters peft adds on the targets (and rank) of the family's shipped config (or its policy's default).

    python scripts/count_parameters.py [--models qwen_image flux2_klein_4b ...] [--json counts.json]

Bytes, as docs/models.md: frozen weights in bf16 at 2 bytes a parameter; LoRA weights trained in float32 with their
gradients and two AdamW states at 16 bytes a parameter; full fine-tuning at 16 bytes a transformer parameter.
``scripts/bench_gpu.py`` builds its full-size random-weight transformers from the same configs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]

#: transformer configs (diffusers class, constructor arguments), each from the source named beside it
TRANSFORMERS = {
    # Qwen/Qwen-Image transformer/config.json, which is also QwenImageTransformer2DModel's defaults (diffusers 0.42);
    # the edit models (Qwen-Image-Edit, -2509, -2511) share it
    "qwen_image": ("QwenImageTransformer2DModel", dict(
        patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56))),
    # Qwen-Image 2.1: QwenImage21Transformer2DModel's defaults (diffusers 0.42.1, whose docstring gives them as the
    # model's: 32 single-stream blocks of 32 heads of 128, SwiGLU x3, 64 latent channels, Qwen3-VL-8B's 4096 wide text)
    "qwen_image21": ("QwenImage21Transformer2DModel", {}),
    # diffusers scripts/convert_flux2_to_diffusers.py, get_flux2_transformer_config("klein-4b" / "klein-9b" / dev)
    "flux2_klein_4b": ("Flux2Transformer2DModel", dict(
        patch_size=1, in_channels=128, num_layers=5, num_single_layers=20, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=7680, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=False)),
    "flux2_klein_9b": ("Flux2Transformer2DModel", dict(
        patch_size=1, in_channels=128, num_layers=8, num_single_layers=24, attention_head_dim=128,
        num_attention_heads=32, joint_attention_dim=12288, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=False)),
    "flux2_dev": ("Flux2Transformer2DModel", dict(
        patch_size=1, in_channels=128, num_layers=8, num_single_layers=48, attention_head_dim=128,
        num_attention_heads=48, joint_attention_dim=15360, timestep_guidance_channels=256, mlp_ratio=3.0,
        axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=True)),
    # Tongyi-MAI/Z-Image(-Turbo) transformer/config.json = ZImageTransformer2DModel's defaults (diffusers 0.42)
    "zimage": ("ZImageTransformer2DModel", dict(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=3840, n_layers=30, n_refiner_layers=2,
        n_heads=30, n_kv_heads=30, cap_feat_dim=2560, axes_dims=[32, 48, 48], axes_lens=[1024, 512, 512])),
    # black-forest-labs/FLUX.1-dev (and FLUX.1-Kontext-dev) transformer/config.json
    "flux1_dev": ("FluxTransformer2DModel", dict(
        patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
        axes_dims_rope=(16, 56, 56))),
    # stabilityai/stable-diffusion-3.5-medium transformer/config.json
    "sd35_medium": ("SD3Transformer2DModel", dict(
        sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, attention_head_dim=64,
        num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
        pos_embed_max_size=384, qk_norm="rms_norm", dual_attention_layers=tuple(range(13)))),
    # diffusers scripts/convert_wan_to_diffusers.py, get_transformer_config("Wan-T2V-1.3B" / "Wan-T2V-14B")
    "wan21_1b3": ("WanTransformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6)),
    "wan21_14b": ("WanTransformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6)),
}


def _qwen3(hidden: int, intermediate: int, tied: bool) -> dict:
    # Qwen/Qwen3-4B and Qwen/Qwen3-8B config.json: 36 layers, 32 heads of 128, 8 key-value heads
    return dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=tied)


def _t5_xxl(vocab: int) -> dict:
    # google/t5-v1_1-xxl (FLUX.1's and SD3's text_encoder_2/3) and google/umt5-xxl (Wan's): the encoder halves
    return dict(vocab_size=vocab, d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24,
                feed_forward_proj="gated-gelu")


#: text encoders (transformers class, config class, config), from each model's config.json on the hub
TEXT_ENCODERS = {
    # Qwen/Qwen2.5-VL-7B-Instruct: 28 layers of 3584, vision tower of 32 blocks of 1280 (with its lm_head: the
    # pipelines load Qwen2_5_VLForConditionalGeneration)
    "Qwen2.5-VL-7B": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", dict(
        text_config=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                         num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
                         rope_scaling={"mrope_section": [16, 24, 24], "rope_type": "default"}),
        vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584),
        vocab_size=152064, tie_word_embeddings=False)),
    # Qwen/Qwen3-VL-8B-Instruct (Qwen-Image 2.1's Qwen3VLForConditionalGeneration): 36 layers of 4096 (Qwen3-8B's
    # text model), vision tower of 27 blocks of 1152 with DeepStack mergers at 8, 16, 24
    "Qwen3-VL-8B": ("Qwen3VLForConditionalGeneration", "Qwen3VLConfig", dict(
        text_config=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=151936),
        vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
                           patch_size=16, deepstack_visual_indexes=[8, 16, 24]),
        tie_word_embeddings=False)),
    "Qwen3-4B": ("Qwen3ForCausalLM", "Qwen3Config", _qwen3(2560, 9728, tied=True)),
    "Qwen3-8B": ("Qwen3ForCausalLM", "Qwen3Config", _qwen3(4096, 12288, tied=False)),
    # mistralai/Mistral-Small-3.1-24B-Instruct-2503 (FLUX.2 [dev]'s text encoder)
    "Mistral-Small-3.1-24B": ("Mistral3ForConditionalGeneration", "Mistral3Config", dict(
        text_config=dict(model_type="mistral", hidden_size=5120, intermediate_size=32768, num_hidden_layers=40,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=131072),
        vision_config=dict(model_type="pixtral", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                           num_attention_heads=16, head_dim=64, patch_size=14, image_size=1540),
        spatial_merge_size=2, projector_hidden_act="gelu", multimodal_projector_bias=False,
        tie_word_embeddings=False)),
    "T5-XXL": ("T5EncoderModel", "T5Config", _t5_xxl(32128)),
    "UMT5-XXL": ("UMT5EncoderModel", "UMT5Config", _t5_xxl(256384)),
    # openai/clip-vit-large-patch14's text tower (FLUX.1: CLIPTextModel; SD3: with its 768 projection)
    "CLIP-L": ("CLIPTextModel", "CLIPTextConfig", dict(
        vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        max_position_embeddings=77)),
    "CLIP-L+proj": ("CLIPTextModelWithProjection", "CLIPTextConfig", dict(
        vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        max_position_embeddings=77, projection_dim=768)),
    # laion/CLIP-ViT-bigG-14's text tower with its 1280 projection (SD3's text_encoder_2)
    "CLIP-G": ("CLIPTextModelWithProjection", "CLIPTextConfig", dict(
        vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
        max_position_embeddings=77, projection_dim=1280, hidden_act="gelu")),
}

_KL_16 = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
              up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
              latent_channels=16, norm_num_groups=32, use_quant_conv=False, use_post_quant_conv=False)
#: VAEs (diffusers class, arguments): the published vae/config.json of each family
VAES = {
    "qwen_image": ("AutoencoderKLQwenImage", {}),  # Qwen/Qwen-Image vae/config.json: the class defaults
    "qwen_image21": ("AutoencoderKLQwenImage21", {}),  # the class defaults (diffusers 0.42.1): 16x, 64 channels, RGBA
    "flux2": ("AutoencoderKLFlux2", {}),  # convert_flux2_to_diffusers.py builds AutoencoderKLFlux2() with defaults
    "flux1": ("AutoencoderKL", _KL_16),  # FLUX.1-dev's; Z-Image and SD3.5 use the same layout
    "wan21": ("AutoencoderKLWan", {}),  # convert_wan_to_diffusers.py builds AutoencoderKLWan() with defaults
}


def _config_lora(name: str) -> tuple[int, list[str]]:
    """Rank and targets of the LoRA a shipped config trains (its policy's default targets where it names none)."""
    policy = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())["model"]["init_args"]["policy"]
    lora = policy["init_args"]["lora"]
    targets = lora.get("target_modules")
    if targets is None:
        module, _, cls = policy["class_path"].rpartition(".")
        targets = list(getattr(__import__(module, fromlist=[cls]), cls).default_lora_targets)
    return lora["rank"], targets


def _flux2_default(num_single: int) -> tuple[int, list[str]]:
    from flowrl.policies.flux2 import flux2_lora_targets

    return 64, list(flux2_lora_targets(num_single))


#: the rows of docs/models.md's memory tables: transformer, text encoders, VAE, LoRA (rank, targets) and its source
FAMILIES = {
    "qwen_image": ("Qwen-Image (and -Edit)", "qwen_image", ["Qwen2.5-VL-7B"], "qwen_image",
                   lambda: _config_lora("qwen_image_flow_grpo"), "config targets"),
    "qwen_image21": ("Qwen-Image 2.1", "qwen_image21", ["Qwen3-VL-8B"], "qwen_image21",
                     lambda: _config_lora("qwen_image21_flow_grpo"), "config targets"),
    "flux2_klein_4b": ("FLUX.2 [klein] 4B", "flux2_klein_4b", ["Qwen3-4B"], "flux2", lambda: _flux2_default(20),
                       "default targets"),
    "flux2_klein_9b": ("FLUX.2 [klein] 9B", "flux2_klein_9b", ["Qwen3-8B"], "flux2",
                       lambda: _config_lora("flux2_klein_flow_grpo"), "config targets"),
    "flux2_dev": ("FLUX.2 [dev]", "flux2_dev", ["Mistral-Small-3.1-24B"], "flux2", lambda: _flux2_default(48),
                  "default targets"),
    "zimage": ("Z-Image(-Turbo)", "zimage", ["Qwen3-4B"], "flux1", lambda: _config_lora("zimage_flow_grpo"),
               "config targets"),
    "flux_kontext": ("FLUX.1 Kontext [dev] (and FLUX.1 [dev])", "flux1_dev", ["T5-XXL", "CLIP-L"], "flux1",
                     lambda: _config_lora("flux_kontext_flow_grpo"), "config targets"),
    "sd35_medium": ("SD3.5-Medium", "sd35_medium", ["T5-XXL", "CLIP-L+proj", "CLIP-G"], "flux1",
                    lambda: _config_lora("sd35_flow_grpo"), "config targets"),
    "wan21_1b3": ("Wan 2.1 T2V 1.3B", "wan21_1b3", ["UMT5-XXL"], "wan21", lambda: _config_lora("wan21_flow_grpo"),
                  "config targets"),
    "wan21_14b": ("Wan 2.1 T2V 14B", "wan21_14b", ["UMT5-XXL"], "wan21", lambda: _config_lora("wan21_flow_grpo"),
                  "config targets"),
}


def build_transformer(name: str, **overrides):
    """The published transformer ``name`` of ``TRANSFORMERS`` (random weights on the current default device)."""
    import diffusers

    cls, config = TRANSFORMERS[name]
    return getattr(diffusers, cls)(**{**config, **overrides})


def numel(module: torch.nn.Module) -> int:
    """Parameters of ``module``, each shared tensor once (tied embeddings count once)."""
    return sum(p.numel() for p in module.parameters())


def lora_numel(module: torch.nn.Module, rank: int, targets: list[str]) -> int:
    """The parameters peft's LoRA of ``rank`` on ``targets`` adds to ``module``: an ``A`` of ``rank x in`` and a ``B``
    of ``out x rank`` on every linear layer whose name peft matches (the module is left as it is)."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    config = LoraConfig(r=rank, target_modules=targets)
    return sum(rank * (m.in_features + m.out_features) for name, m in module.named_modules()
               if isinstance(m, torch.nn.Linear) and check_target_module_exists(config, name))


def text_encoder_numel(name: str) -> int:
    import transformers

    model, config_class, config = TEXT_ENCODERS[name]
    return numel(getattr(transformers, model)(getattr(transformers, config_class)(**config)))


def vae_numel(name: str) -> int:
    import diffusers

    cls, config = VAES[name]
    return numel(getattr(diffusers, cls)(**config))


def count(family: str) -> dict:
    """Counts and bytes of one ``FAMILIES`` row, every module built on the meta device."""
    label, transformer, encoders, vae, lora, lora_kind = FAMILIES[family]
    rank, targets = lora()
    with torch.device("meta"):
        model = build_transformer(transformer)
        n_transformer = numel(model)
        n_lora = lora_numel(model, rank, targets)
        n_text = {name: text_encoder_numel(name) for name in encoders}
        n_vae = vae_numel(vae)
    frozen = n_transformer + sum(n_text.values()) + n_vae
    return {"model": label, "transformer_b": n_transformer / 1e9, "text_encoders_b": {k: v / 1e9 for k, v in
                                                                                       n_text.items()},
            "vae_b": n_vae / 1e9, "frozen_bf16_gb": 2 * frozen / 1e9, "lora_rank": rank, "lora_kind": lora_kind,
            "lora_m": n_lora / 1e6, "lora_gb": 16 * n_lora / 1e9, "full_finetune_gb": 16 * n_transformer / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--json", default=None, help="also write the counts here")
    args = parser.parse_args()
    rows = {name: count(name) for name in args.models}
    print(f"{'model':<40}{'transformer':>12}  {'text encoders':<54}{'VAE':>6}{'frozen bf16':>13}"
          f"{'LoRA':>22}{'full FT':>10}")
    for r in rows.values():
        text = " + ".join(f"{k} {v:.2f} B" for k, v in r["text_encoders_b"].items())
        lora = f"r{r['lora_rank']} {r['lora_m']:.0f} M: {r['lora_gb']:.1f} GB"
        print(f"{r['model']:<40}{r['transformer_b']:>10.2f} B  {text:<54}{r['vae_b']:>6.2f}"
              f"{r['frozen_bf16_gb']:>10.1f} GB{lora:>22}{r['full_finetune_gb']:>7.0f} GB")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

"""A reward callback on a LightningModule that is not flowrl's: it scores what ``validation_step`` returns."""

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader

from flowrl.methods import BaseModule
from flowrl.rewards import JpegIncompressibility, RewardCallback, jpeg_size_kb


class Brightness(RewardCallback):
    """Mean pixel value; NaN for prompts that say "broken" (left out of the mean, not counted as 0)."""

    default_name = "brightness"

    def _score(self, images, prompts, metadata):
        out = images.mean(dim=(1, 2, 3))
        return torch.where(torch.tensor(["broken" in p for p in prompts]), torch.nan, out)


class PlainGenerator(LightningModule):
    """Some other project's image generator: a prompt's length sets a grey level, plus seeded noise."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(0.05))

    def generate(self, prompts):
        grey = torch.tensor([len(p) for p in prompts], dtype=torch.float32) * self.scale
        noise = torch.rand(len(prompts), 3, 16, 16, generator=torch.Generator().manual_seed(len(prompts)))
        return (grey[:, None, None, None] * 0.5 + noise * 0.5).clamp(0, 1)

    def validation_step(self, prompts, batch_idx):
        return {"images": self.generate(prompts), "prompts": prompts}


PROMPTS = ["a cat", "a red bicycle", "broken", "a tree at night", "sun"]


def validate(module, rewards):
    trainer = Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=rewards)
    loader = DataLoader(PROMPTS, batch_size=2, collate_fn=list)  # batches of 2, 2 and 1
    return trainer.validate(module, loader, verbose=False)[0]


def test_reward_callbacks_score_validation_outputs_of_any_module():
    module = PlainGenerator()
    metrics = validate(module, [JpegIncompressibility(), Brightness()])
    with torch.no_grad():
        images = torch.cat([module.generate(PROMPTS[i:i + 2]) for i in range(0, 5, 2)])
    # the epoch mean over every image (not a mean of batch means: the last batch holds one image)
    assert abs(metrics["val/jpeg_incompressibility"] - jpeg_size_kb(images).mean().item()) < 1e-5
    finite = [i for i, p in enumerate(PROMPTS) if p != "broken"]
    assert abs(metrics["val/brightness"] - images[finite].mean(dim=(1, 2, 3)).mean().item()) < 1e-6


def test_modules_that_score_their_own_rewards_are_not_scored_twice():
    assert BaseModule.scores_own_rewards

    class SelfScoring(PlainGenerator):
        scores_own_rewards = True

    assert "val/brightness" not in validate(SelfScoring(), [Brightness()])

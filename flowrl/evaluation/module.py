"""The evaluation as a LightningModule for ``trainer.predict``: each batch holds whole prompts with all their seeds,
and ``predict_step`` draws every model's image of each (prompt, seed), scores them with every metric and measures
drift and diversity, so everything paired or per prompt is computed where the images are, on any number of devices.

The images are :meth:`~flowrl.methods.generation.Generation.generate`'s, as every method draws them (the
deterministic sampler with the pipeline's solver from each seed's noise, :func:`flowrl.sampling.sampler.seeded_noise`):
the noise of a (prompt, seed) depends on the seed alone, so every model starts from the same noise. Batches are a pure
function of (prompt count, seeds, batch size, rank, world size) and hold the same rows whatever the number of
processes, which is what makes 2 processes write what 1 writes.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from PIL import Image
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from flowrl.callbacks.image_writer import image_name
from flowrl.data import EvalLoader, data_parallel_rank
from flowrl.evaluation.models import Model
from flowrl.evaluation.signals import DISTANCES, mean_pairwise
from flowrl.evaluation.suites import Suite
from flowrl.methods.distributed import Ranks
from flowrl.methods.generation import Generation
from flowrl.methods.validation import RewardSetOwner


def evaluation_batches(num_prompts: int, seeds: list[int], prompts_per_batch: int, rank: int = 0,
                       world_size: int = 1) -> list[dict]:
    """This rank's batches: batch ``b`` holds prompts ``b k .. (b + 1) k - 1`` (``k = prompts_per_batch``), each with
    every seed, and rank ``r`` takes the batches ``b % world_size == r``.

    >>> [(b["prompt_ids"].tolist(), b["seeds"].tolist()) for b in evaluation_batches(3, [0, 7], 2)]
    [([0, 0, 1, 1], [0, 7, 0, 7]), ([2, 2], [0, 7])]
    >>> [b["prompt_ids"].tolist() for b in evaluation_batches(3, [0, 7], 2, rank=1, world_size=2)]
    [[2, 2]]
    """
    batches = []
    for b, start in enumerate(range(0, num_prompts, prompts_per_batch)):
        if b % world_size != rank:
            continue
        ids = range(start, min(start + prompts_per_batch, num_prompts))
        batches.append({"prompt_ids": torch.tensor([i for i in ids for _ in seeds]),
                        "seeds": torch.tensor([s for _ in ids for s in seeds])})
    return batches


class EvaluationProgressBar(TQDMProgressBar):
    """Lightning's bar over the generation, saying what a batch is."""

    def __init__(self, description: str):
        super().__init__()
        self.description = description

    @property
    def predict_description(self) -> str:
        return self.description


class Evaluator(RewardSetOwner, LightningModule):
    """Draws, scores and measures every model on the rows of each batch.

    Args:
        models: the base model first, then the tuned ones (:func:`flowrl.evaluation.models.load_models`).
        suite: the prompts; ``suite.records`` reach the rewards as ``metadata["suite"]``.
        seeds: every prompt's seeds. num_steps: ODE steps. guidance_scale: classifier-free guidance.
        prompts_per_batch: prompts per batch (each with every seed, for every model).
        feature_metric: the metric whose ``image_features`` give the feature space (None: pixels only).
        image_dir: where every image is written as ``<model>/<image_name>.png`` (None: not written).
        grid: the (prompt index, seed) cells whose images are kept for the report's grid.
    """

    def __init__(self, models: list[Model], suite: Suite, seeds: list[int], num_steps: int, guidance_scale: float,
                 prompts_per_batch: int, feature_metric: Optional[str] = None, image_dir: Optional[str] = None,
                 grid: frozenset = frozenset()):
        super().__init__()
        self.policy = models[0].policy  # registered: it moves to the device
        self.generation = Generation(self.policy, guidance_scale, num_steps, placement=self)  # draws every model
        self.models, self.suite, self.seeds = models, suite, list(seeds)
        self.prompts_per_batch, self.feature_metric = prompts_per_batch, feature_metric
        self.image_dir, self.grid = image_dir, grid
        # fully fine-tuned models are policies of their own: registered, so that they move to the device too
        self.own_policies = nn.ModuleList(m.policy for m in models if m.policy is not models[0].policy)
        self.scores: list[tuple] = []  # (model, prompt index, seed, metric, value)
        self.diversity: list[tuple] = []  # (model, prompt index, space, value)
        self.grid_images: dict[tuple, np.ndarray] = {}  # (model, prompt index, seed) -> [H, W, 3] uint8

    scores_own_rewards = True  # reward callbacks must not score its outputs a second time

    @property
    def ranks(self) -> Ranks:
        """Collectives over the ranks of the running trainer."""
        return Ranks(self.trainer, self.all_gather, self.device)

    def predict_dataloader(self) -> EvalLoader:
        return EvalLoader(evaluation_batches(len(self.suite), self.seeds, self.prompts_per_batch,
                                             *data_parallel_rank(self.trainer)))

    def on_predict_start(self) -> None:
        # every rank writes its own rows' images into rank zero's folder (a rank launched later may name another)
        self.image_dir = self.trainer.strategy.broadcast(self.image_dir)
        # the last rank holds the fewest batches (rank r takes batches b % world_size == r): known without asking
        world = data_parallel_rank(self.trainer)[1]
        self.shared_batches = len(evaluation_batches(len(self.suite), self.seeds, self.prompts_per_batch, world - 1,
                                                     world))

    def on_predict_batch_end(self, outputs, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        # a SIGTERM stops every rank after the same batch (Lightning's predict loop never reads its flag); a rank
        # holding batches the others lack goes on to the end, where run() decides once more, on every rank
        if batch_idx < self.shared_batches - 1 and self.ranks.sigterm_anywhere():
            raise SIGTERMException

    @contextmanager
    def drawing(self, model: Model) -> Iterator[None]:
        """Within this context ``generation`` draws from ``model``."""
        backbone = self.generation.policy
        self.generation.policy = model.policy
        try:
            with model.active():
                yield
        finally:
            self.generation.policy = backbone

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        ids, seeds = batch["prompt_ids"].tolist(), batch["seeds"]
        images, features = self.draw_and_score(ids, seeds)
        self.measure(ids, seeds, {"pixels": images, **({"features": features} if features else {})})
        return {"rows": len(ids)}  # the results stay on the module (gathered after predict), not in Lightning's list

    def draw_and_score(self, ids: list[int], seeds: Tensor) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """Every model's images ``{model: [B, 3, H, W]}`` of the rows, each scored by every metric (kept), and their
        features ``{model: [B, D]}`` (empty without a feature space)."""
        prompts = [self.suite.prompts[i] for i in ids]
        metadata = {"seeds": seeds, "suite": [self.suite.records[i] for i in ids]}
        images, features = {}, {}
        for model in self.models:
            with self.drawing(model):
                images[model.name] = self.generation.generate(prompts, seeds.to(self.device)).float()
            for reward in self.reward_set.callbacks:
                scores = self.score(reward, images[model.name], prompts, metadata)  # [B]
                self.keep(model.name, ids, seeds, reward.name, scores)
            if self.feature_metric is not None:
                reward = next(r for r in self.reward_set.callbacks if r.name == self.feature_metric)
                features[model.name] = reward.image_features(images[model.name]).float()
            self.write(model.name, ids, seeds, prompts, images[model.name])
        return images, features

    def measure(self, ids: list[int], seeds: Tensor, spaces: dict[str, dict[str, Tensor]]) -> None:
        """Keeps each tuned model's drift from the base per row and every model's diversity per prompt, in each
        space (``{space: {model: [B, ...]}}``)."""
        base = self.models[0].name
        for space, values in spaces.items():
            for model in self.models:
                if model.name != base:
                    drift = DISTANCES[space](values[model.name], values[base])  # [B]
                    self.keep(model.name, ids, seeds, f"drift_{space}", drift)
                for i in dict.fromkeys(ids):  # a batch holds each of its prompts with all its seeds
                    rows = [r for r, j in enumerate(ids) if j == i]
                    diversity = mean_pairwise(values[model.name][rows], DISTANCES[space])
                    self.diversity.append((model.name, i, space, diversity))

    def score(self, reward, images: Tensor, prompts: list[str], metadata: dict) -> Tensor:
        """A metric's scores ``[B]``; NaN for a batch it cannot read (as ``predict``: the images still count)."""
        try:
            return reward.score(images, prompts, metadata).detach().float().cpu()
        except (ValueError, TypeError) as err:
            rank_zero_warn(f"metric {reward.name!r} cannot score these prompts, its scores are NaN: {err}")
            return torch.full((len(prompts),), torch.nan)

    def keep(self, model: str, ids: list[int], seeds: Tensor, metric: str, values: Tensor) -> None:
        self.scores += [(model, i, s, metric, float(v)) for i, s, v in zip(ids, seeds.tolist(), values.tolist())]

    def write(self, model: str, ids: list[int], seeds: Tensor, prompts: list[str], images: Tensor) -> None:
        """Writes the images (when ``image_dir`` is set) and keeps the grid's."""
        pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()  # [B,H,W,3]
        for array, i, seed, prompt in zip(pixels, ids, seeds.tolist(), prompts):
            if self.image_dir is not None:
                folder = Path(self.image_dir) / model
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.ascontiguousarray(array)).save(folder / image_name(i, prompt, seed))
            if (i, seed) in self.grid:
                self.grid_images[(model, i, seed)] = np.ascontiguousarray(array)

    def gathered(self) -> tuple[list[tuple], list[tuple], dict]:
        """Every rank's scores, diversities and grid images (call on every rank, after ``trainer.predict``)."""
        mine = (self.scores, self.diversity, self.grid_images)
        if self.trainer.world_size == 1:
            return mine
        everyone: list = [None] * self.trainer.world_size
        torch.distributed.all_gather_object(everyone, mine)
        everyone = everyone[::self.ranks.degree]  # a context-parallel group's processes hold the same rows
        return ([row for part in everyone for row in part[0]], [row for part in everyone for row in part[1]],
                {k: v for part in everyone for k, v in part[2].items()})

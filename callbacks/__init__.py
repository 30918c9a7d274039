"""Reusable callbacks (installed as ``flowrl.callbacks``). ``EMA`` averages the trainable weights only; Lightning's
``EMAWeightAveraging`` (a copy of the whole module) stays available."""

from lightning.pytorch.callbacks import EMAWeightAveraging

from flowrl.callbacks.ema import EMA
from flowrl.callbacks.ema_weights import EMAWeights
from flowrl.callbacks.evaluation_budget import EvaluationBudget
from flowrl.callbacks.image_writer import ImageWriter
from flowrl.callbacks.lora_weights import LoraWeights
from flowrl.callbacks.progress import RunProgressBar
from flowrl.callbacks.run_header import RunHeader
from flowrl.callbacks.run_summary import RunSummary
from flowrl.callbacks.sample_grid import SampleGrid, grid_image
from flowrl.callbacks.sigterm_stop import SigtermStop

__all__ = ["EMA", "EMAWeightAveraging", "EMAWeights", "EvaluationBudget", "ImageWriter", "LoraWeights", "RunHeader", "RunProgressBar", "RunSummary",
           "SampleGrid", "SigtermStop", "grid_image"]

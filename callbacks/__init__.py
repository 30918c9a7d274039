"""Reusable callbacks (installed as ``flowrl.callbacks``). EMA is Lightning's ``EMAWeightAveraging``."""

from lightning.pytorch.callbacks import EMAWeightAveraging

from flowrl.callbacks.run_summary import RunSummary
from flowrl.callbacks.sample_grid import SampleGrid, grid_image

__all__ = ["EMAWeightAveraging", "RunSummary", "SampleGrid", "grid_image"]

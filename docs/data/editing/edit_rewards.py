"""An edit reward as a plain function, for flowrl.rewards.FunctionReward (docs/editing.md): it reads each row's
source images from metadata["images"] and scores how well the edit keeps the source's palette."""

import torch


def keeps_palette(images, prompts, metadata):
    """1 - the mean absolute difference of the mean colour of each edit and of its record's first source image.

    images: [B, 3, H, W] in [0, 1] (the edits); prompts: the B instructions; metadata["images"]: B lists of source
    images [3, h, w] in [0, 1], each at its own size.
    """
    sources = torch.stack([row[0].float().mean(dim=(1, 2)) for row in metadata["images"]]).to(images.device)
    return 1 - (images.float().mean(dim=(2, 3)) - sources).abs().mean(dim=1)

"""Batched on-device augmentation with per-sample random draws (docs/architecture.md, principle 4).

torchvision.transforms.v2 draws one set of random parameters per batch tensor, so these functions
draw every parameter per sample from an explicit ``torch.Generator`` and apply them with tensor
ops (index arithmetic, ``affine_grid``/``grid_sample``), never a Python loop over samples. The
generator may live on another device than the batch (a CPU generator for a GPU batch): the small
parameter tensors are drawn on the generator's device and moved. The same generator state gives the
same output.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

Augmentation = Callable[[torch.Tensor, torch.Generator], torch.Tensor]

# ITU-R 601 luma weights, as torchvision's rgb_to_grayscale.
_LUMA_WEIGHTS = (0.299, 0.587, 0.114)


def _uniform(low: float, high: float, size: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``size`` draws from U[low, high) on the generator's device, moved to ``device``."""
    draws = torch.rand(size, generator=generator, device=generator.device)
    return (low + (high - low) * draws).to(device)


def _bernoulli(probability: float, size: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``size`` boolean draws, True with ``probability``, moved to ``device``."""
    return _uniform(0.0, 1.0, size, generator, device) < probability


def crop_flip(x: torch.Tensor, generator: torch.Generator, padding: int = 4, flip: bool = True) -> torch.Tensor:
    """Random crop with zero padding plus random horizontal flip, drawn per sample.

    Each image ``[C, H, W]`` is zero-padded by ``padding`` on every side, cropped back to
    ``H × W`` at an offset drawn uniformly from ``0..2·padding`` in each direction, and, if
    ``flip``, mirrored left-right with probability 1/2 (torchvision's RandomCrop(padding) +
    RandomHorizontalFlip, but with independent draws for every sample). Implemented as one
    ``gather`` of the padded batch.
    """
    batch, channels, height, width = x.shape
    padded_width = width + 2 * padding
    shifts = torch.randint(0, 2 * padding + 1, (2, batch), generator=generator, device=generator.device).to(x.device)
    shift_y, shift_x = shifts[0], shifts[1]
    rows = shift_y[:, None] + torch.arange(height, device=x.device)  # [B, H]
    cols = torch.arange(width, device=x.device).expand(batch, width)
    if flip:
        flipped = _bernoulli(0.5, batch, generator, x.device)
        cols = torch.where(flipped[:, None], width - 1 - cols, cols)
    cols = shift_x[:, None] + cols  # [B, W]
    source = (rows[:, :, None] * padded_width + cols[:, None, :]).reshape(batch, 1, height * width)
    padded = F.pad(x, (padding, padding, padding, padding)).reshape(batch, channels, -1)
    cropped = padded.gather(2, source.expand(batch, channels, height * width))
    return cropped.reshape(batch, channels, height, width)


def _identity(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return x


def _crop_flip_scaled(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``crop_flip`` with padding H/8 (the standard 4 px at 32 px; 1 px at 8 px, 8 px at 64 px)."""
    return crop_flip(x, generator, padding=max(1, round(x.shape[-2] / 8)))


def get_augmentation(name: str) -> Augmentation:
    """The training augmentation named by ``data.augmentation`` / ``DatasetInfo.augmentation``.

    ``"none"``: identity. ``"crop_flip"``: :func:`crop_flip` with padding ``max(1, round(H/8))``, so
    CIFAR and SVHN get the usual 4 px and 8×8 digits are not cropped away.
    """
    augmentations: dict[str, Augmentation] = {"none": _identity, "crop_flip": _crop_flip_scaled}
    if name not in augmentations:
        raise ValueError(f"unknown augmentation {name!r}; expected one of {sorted(augmentations)}")
    return augmentations[name]


def ssl_views(
    x: torch.Tensor,
    generator: torch.Generator,
    crop_scale: tuple[float, float] = (0.3, 1.0),
    aspect_ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
    jitter: float = 0.4,
    jitter_probability: float = 0.8,
    grayscale_probability: float = 0.2,
    noise_std: float = 0.02,
) -> torch.Tensor:
    """One self-supervised view of every image (call twice for two views), SimCLR/BYOL-style.

    ``x`` is float ``[B, C, H, W]`` on the 0..1 scale (normalise afterwards if the model wants it);
    the output has the same shape, clamped to 0..1. Per sample:

    1. random resized crop: a window of area ``U(crop_scale)`` of the image with aspect ratio
       log-uniform in ``aspect_ratio`` (clipped to the image) at a uniform position, resampled
       bilinearly to ``H × W`` (``affine_grid`` + ``grid_sample``); ``crop_scale`` starts at 0.3
       rather than SimCLR's 0.08 so that an 8×8 digit keeps its shape;
    2. horizontal flip with probability 1/2 (if ``flip``);
    3. with probability ``jitter_probability``: brightness ×U[1±jitter], contrast (blend with the
       image's mean intensity) ×U[1±jitter] and, for RGB, saturation (blend with its grey image)
       ×U[1±jitter];
    4. for RGB, grey-scale with probability ``grayscale_probability``;
    5. additive Gaussian noise of std ``noise_std``.
    """
    batch, channels, height, width = x.shape
    device = x.device
    area = _uniform(crop_scale[0], crop_scale[1], batch, generator, device)
    log_ratio = _uniform(math.log(aspect_ratio[0]), math.log(aspect_ratio[1]), batch, generator, device)
    # Window size as a fraction of the image side; the grid's unit is half the image side.
    window_w = torch.sqrt(area * torch.exp(log_ratio)).clamp(max=1.0)
    window_h = torch.sqrt(area / torch.exp(log_ratio)).clamp(max=1.0)
    center_x = (1 - window_w) * _uniform(-1.0, 1.0, batch, generator, device)
    center_y = (1 - window_h) * _uniform(-1.0, 1.0, batch, generator, device)
    mirror = _bernoulli(0.5 if flip else 0.0, batch, generator, device)
    theta = torch.zeros(batch, 2, 3, device=device, dtype=x.dtype)
    theta[:, 0, 0] = torch.where(mirror, -window_w, window_w)
    theta[:, 0, 2] = center_x
    theta[:, 1, 1] = window_h
    theta[:, 1, 2] = center_y
    grid = F.affine_grid(theta, [batch, channels, height, width], align_corners=False)
    views = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)

    jittered = _bernoulli(jitter_probability, batch, generator, device)
    brightness = _uniform(1 - jitter, 1 + jitter, batch, generator, device)
    contrast = _uniform(1 - jitter, 1 + jitter, batch, generator, device)
    saturation = _uniform(1 - jitter, 1 + jitter, batch, generator, device)
    to_gray = _bernoulli(grayscale_probability, batch, generator, device)
    noise_seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))

    def per_sample(values: torch.Tensor) -> torch.Tensor:
        factor = torch.where(jittered, values, torch.ones_like(values))
        return factor.to(x.dtype).view(batch, 1, 1, 1)

    views = (views * per_sample(brightness)).clamp(0, 1)
    mean = views.mean(dim=(1, 2, 3), keepdim=True)
    views = ((views - mean) * per_sample(contrast) + mean).clamp(0, 1)
    if channels == 3:
        luma = torch.tensor(_LUMA_WEIGHTS, device=device, dtype=x.dtype).view(1, 3, 1, 1)
        gray = (views * luma).sum(dim=1, keepdim=True)
        views = ((views - gray) * per_sample(saturation) + gray).clamp(0, 1)
        gray = (views * luma).sum(dim=1, keepdim=True)
        views = torch.where(to_gray.view(batch, 1, 1, 1), gray.expand_as(views), views)
    # Full-size noise is drawn on the batch's device from a generator seeded by `generator`, so a
    # CPU generator does not mean a CPU-sized tensor transfer.
    noise_generator = torch.Generator(device=device).manual_seed(noise_seed)
    noise = torch.randn(views.shape, generator=noise_generator, device=device, dtype=x.dtype)
    return (views + noise_std * noise).clamp(0, 1)

"""Batched public-data augmentation (FCCL+ § 4.1), on tensors, on the training device.

* ``weak``: RandomResizedCrop(size, scale=(0.2, 1), ratio=(3/4, 4/3)) + horizontal flip
  (the FCCL+ paper text, § 4.1).
* ``weak_code``: RandomCrop(size, padding=4) + horizontal flip, zero (black) padding: the
  authors' FCCL+ code that produced the published tables.
* ``strong``: weak + ColorJitter(0.4, 0.4, 0.4, 0.1) with p = 0.8 + RandomGrayscale(p = 0.2).
* ``none``: identity.

Every sample gets its own random parameters, yet the whole batch is transformed in a
few tensor ops (one ``affine_grid`` / ``grid_sample`` for the crops), so augmentation
never becomes the bottleneck of the collaborative step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import ConfigError

RECIPES = ("none", "weak", "weak_code", "strong")


def _crop_flip(x: torch.Tensor, g: torch.Generator, scale=(0.2, 1.0), ratio=(3 / 4, 4 / 3)) -> torch.Tensor:
    b = x.shape[0]
    dev = x.device
    area = torch.empty(b).uniform_(*scale, generator=g)
    logr = torch.empty(b).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=g)
    r = torch.exp(logr)
    # Crop width/height as fractions of the image side (clamped to fit, as torchvision's fallback).
    w = torch.sqrt(area * r).clamp(max=1.0)
    h = torch.sqrt(area / r).clamp(max=1.0)
    cx = (torch.rand(b, generator=g) * (1 - w) + w / 2) * 2 - 1  # centre in [-1, 1]
    cy = (torch.rand(b, generator=g) * (1 - h) + h / 2) * 2 - 1
    flip = torch.where(torch.rand(b, generator=g) < 0.5, -1.0, 1.0)
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0] = w * flip
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = h
    theta[:, 1, 2] = cy
    grid = F.affine_grid(theta.to(dev, x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def _pad_crop_flip(x: torch.Tensor, g: torch.Generator, pad: int = 4) -> torch.Tensor:
    """RandomCrop(size, padding=pad) + horizontal flip, per sample; padding is black (-1 in [-1, 1])."""
    b, c, h, w = x.shape
    dev = x.device
    xp = F.pad(x, (pad, pad, pad, pad), value=-1.0)
    oy = torch.randint(0, 2 * pad + 1, (b,), generator=g)
    ox = torch.randint(0, 2 * pad + 1, (b,), generator=g)
    flip = torch.rand(b, generator=g) < 0.5
    cols = torch.arange(w)
    cols = torch.where(flip[:, None], cols.flip(0), cols)  # a flipped crop reads its columns backwards
    rows = (oy[:, None] + torch.arange(h)).to(dev)
    cols = (ox[:, None] + cols).to(dev)
    bi = torch.arange(b, device=dev)[:, None, None, None]
    ci = torch.arange(c, device=dev)[None, :, None, None]
    return xp[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]


def _gray(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 1:
        return x
    w = torch.tensor([0.299, 0.587, 0.114], device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True).expand_as(x)


def _jitter(x: torch.Tensor, g: torch.Generator, b=0.4, c=0.4, s=0.4, hue=0.1, p=0.8) -> torch.Tensor:
    """Brightness, contrast, saturation (fixed order) and a hue shift, per sample; x in [0, 1]."""
    n = x.shape[0]
    dev, dt = x.device, x.dtype

    def factor(amount):
        return torch.empty(n).uniform_(1 - amount, 1 + amount, generator=g).to(dev, dt).view(n, 1, 1, 1)

    apply = (torch.rand(n, generator=g) < p).to(dev).view(n, 1, 1, 1)
    y = x * factor(b)
    mean = _gray(y).mean(dim=(1, 2, 3), keepdim=True)
    y = (y - mean) * factor(c) + mean
    gray = _gray(y)
    y = (y - gray) * factor(s) + gray
    if x.shape[1] == 3 and hue > 0:
        # Hue rotation in YIQ space: rotate the chroma plane by 2*pi*h.
        ang = (torch.empty(n).uniform_(-hue, hue, generator=g) * 2 * math.pi).to(dev, dt)
        cos, sin = torch.cos(ang).view(n, 1, 1), torch.sin(ang).view(n, 1, 1)
        to_yiq = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]], device=dev, dtype=dt)
        yiq = torch.einsum("ij,njhw->nihw", to_yiq, y)
        i, q = yiq[:, 1], yiq[:, 2]
        yiq = torch.stack([yiq[:, 0], cos * i - sin * q, sin * i + cos * q], 1)
        y = torch.einsum("ij,njhw->nihw", torch.linalg.inv(to_yiq), yiq)
    y = y.clamp(0, 1)
    return torch.where(apply, y, x)


def augment(x: torch.Tensor, recipe: str, g: torch.Generator) -> torch.Tensor:
    """Augment a float batch in [-1, 1] (as :func:`normalize` gives) with ``recipe``."""
    if recipe == "none":
        return x
    if recipe not in RECIPES:
        raise ConfigError(f"public_aug: unknown recipe {recipe!r}; valid: {', '.join(RECIPES)}")
    if recipe == "weak_code":
        return _pad_crop_flip(x, g)
    y = _crop_flip(x, g)
    if recipe == "strong":
        y01 = (y + 1) / 2
        y01 = _jitter(y01, g)
        gray = (torch.rand(len(y), generator=g) < 0.2).to(y.device).view(-1, 1, 1, 1)
        y01 = torch.where(gray, _gray(y01), y01)
        y = y01 * 2 - 1
    return y

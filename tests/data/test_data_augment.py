"""Batched augmentation: per-sample draws, determinism for a generator seed, correctness."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedray.data import crop_flip, get_augmentation, ssl_views


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def identical_batch(batch: int, channels: int, size: int) -> torch.Tensor:
    """`batch` copies of one random image (0..1), so any difference between outputs is a draw."""
    image = torch.rand(1, channels, size, size, generator=seeded(99))
    return image.expand(batch, -1, -1, -1).contiguous()


def all_crop_flips(image: torch.Tensor, padding: int) -> list[torch.Tensor]:
    """Every image crop_flip may produce from `image`, enumerated one by one."""
    _, height, width = image.shape
    padded = F.pad(image, (padding,) * 4)
    crops = [padded[:, dy : dy + height, dx : dx + width] for dy in range(2 * padding + 1) for dx in range(2 * padding + 1)]
    return crops + [crop.flip(-1) for crop in crops]


def test_crop_flip_output_is_a_crop_or_flipped_crop_of_each_input() -> None:
    x = torch.rand(6, 3, 8, 8, generator=seeded(0))
    out = crop_flip(x, seeded(1), padding=2)
    assert out.shape == x.shape and out.dtype == x.dtype
    for image, augmented in zip(x, out):
        assert any(torch.equal(augmented, candidate) for candidate in all_crop_flips(image, 2))


def test_crop_flip_draws_per_sample() -> None:
    out = crop_flip(identical_batch(32, 3, 16), seeded(0), padding=4)
    distinct = {tuple(image.flatten().tolist()) for image in out}
    assert len(distinct) > 16
    # Both flipped and unflipped samples occur in one batch.
    image = identical_batch(1, 3, 16)[0]
    unflipped = all_crop_flips(image, 4)[:81]
    is_unflipped = [any(torch.equal(o, c) for c in unflipped) for o in out]
    assert 0 < sum(is_unflipped) < len(out)


def test_crop_flip_is_deterministic_for_a_generator_seed() -> None:
    x = torch.rand(16, 1, 8, 8, generator=seeded(0))
    torch.testing.assert_close(crop_flip(x, seeded(5)), crop_flip(x, seeded(5)), rtol=0, atol=0)
    assert not torch.equal(crop_flip(x, seeded(5)), crop_flip(x, seeded(6)))


def test_crop_flip_without_padding_or_flip_is_identity() -> None:
    x = torch.rand(4, 3, 8, 8, generator=seeded(0))
    assert torch.equal(crop_flip(x, seeded(1), padding=0, flip=False), x)


def test_get_augmentation() -> None:
    x = torch.rand(8, 1, 8, 8, generator=seeded(0))
    assert torch.equal(get_augmentation("none")(x, seeded(1)), x)
    out = get_augmentation("crop_flip")(x, seeded(1))
    assert out.shape == x.shape
    assert not torch.equal(out, x)
    for image, augmented in zip(x, out):  # 8×8 images are padded by 1 px, not 4
        assert any(torch.equal(augmented, candidate) for candidate in all_crop_flips(image, 1))
    with pytest.raises(ValueError, match="unknown augmentation"):
        get_augmentation("mixup")


@pytest.mark.parametrize("channels,size", [(1, 8), (3, 32)])
def test_ssl_views_shape_range_and_per_sample_draws(channels: int, size: int) -> None:
    x = identical_batch(16, channels, size)
    views = ssl_views(x, seeded(0))
    assert views.shape == x.shape and views.dtype == x.dtype
    assert views.min() >= 0 and views.max() <= 1
    assert len({tuple(v.flatten().tolist()) for v in views}) == 16
    # The geometry alone (no colour jitter, no noise) differs per sample too.
    geometric = ssl_views(x, seeded(0), jitter=0.0, grayscale_probability=0.0, noise_std=0.0)
    assert len({tuple(v.flatten().tolist()) for v in geometric}) == 16


def test_ssl_views_is_deterministic_and_two_views_differ() -> None:
    x = torch.rand(8, 3, 32, 32, generator=seeded(0))
    generator = seeded(3)
    first, second = ssl_views(x, generator), ssl_views(x, generator)
    assert not torch.allclose(first, second)
    replay = seeded(3)
    torch.testing.assert_close(ssl_views(x, replay), first, rtol=0, atol=0)
    torch.testing.assert_close(ssl_views(x, replay), second, rtol=0, atol=0)


def test_ssl_views_full_crop_without_flip_or_colour_is_identity() -> None:
    x = torch.rand(4, 3, 16, 16, generator=seeded(0))
    same = ssl_views(
        x,
        seeded(1),
        crop_scale=(1.0, 1.0),
        aspect_ratio=(1.0, 1.0),
        flip=False,
        jitter=0.0,
        grayscale_probability=0.0,
        noise_std=0.0,
    )
    torch.testing.assert_close(same, x, rtol=0, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_generator_with_cuda_batch() -> None:
    x = torch.rand(8, 3, 32, 32, generator=seeded(0))
    on_gpu = crop_flip(x.cuda(), seeded(1))
    assert on_gpu.is_cuda
    torch.testing.assert_close(on_gpu.cpu(), crop_flip(x, seeded(1)), rtol=0, atol=0)
    views = ssl_views(x.cuda(), seeded(2))
    assert views.is_cuda and views.shape == x.shape

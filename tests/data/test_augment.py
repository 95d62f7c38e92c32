"""On-device batched augmentation: random crop with zero padding and horizontal flip."""

import pytest
import torch
import torch.nn.functional as F

from pfl.data.augment import Augment, Draw, crop_flip, from_config
from pfl.errors import ConfigError
from pfl.seeding import torch_generator


def images(b=16, c=3, h=8, w=10, seed=0):
    return torch.rand(b, c, h, w, generator=torch.Generator().manual_seed(seed))


def reference(x, padding, draw):
    """Per-sample slicing, the obvious way: what the batched gather must equal."""
    h, w = x.shape[-2:]
    out = []
    for i, img in enumerate(x):
        p = F.pad(img, (padding,) * 4)
        crop = p[:, int(draw.dy[i]) : int(draw.dy[i]) + h, int(draw.dx[i]) : int(draw.dx[i]) + w]
        out.append(crop.flip(-1) if bool(draw.flip[i]) else crop)
    return torch.stack(out)


def test_batched_crop_flip_equals_per_sample_slicing():
    x = images()
    aug = Augment(crop_padding=3, flip=True)
    draw = aug.draw(len(x), torch_generator(0, "aug"))
    assert draw.flip.any() and not draw.flip.all() and len(set(draw.dx.tolist())) > 1
    assert torch.equal(crop_flip(x, 3, draw), reference(x, 3, draw))


def test_call_uses_draw_from_the_generator():
    x = images()
    aug = Augment()
    out = aug(x, torch_generator(1, "aug"))
    assert torch.equal(out, crop_flip(x, 4, aug.draw(len(x), torch_generator(1, "aug"))))


def test_deterministic_per_seed_and_different_across_seeds():
    x = images(b=32)
    aug = from_config("cifar")
    a = aug(x, torch_generator(0, 3, "aug"))
    b = aug(x, torch_generator(0, 3, "aug"))
    c = aug(x, torch_generator(0, 4, "aug"))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_shape_and_dtype_preserved():
    for shape in [(5, 1, 28, 28), (3, 3, 32, 32), (2, 3, 7, 13)]:
        x = torch.rand(shape).to(torch.float64)
        out = Augment()(x, torch_generator(0))
        assert out.shape == x.shape and out.dtype == x.dtype


def test_flip_applied_to_about_half():
    x = images(b=2000, h=4, w=5)
    out = from_config("flip")(x, torch_generator(7, "aug"))
    flipped = (out == x.flip(-1)).flatten(1).all(1)
    kept = (out == x).flatten(1).all(1)
    assert bool((flipped ^ kept).all())  # flip-only: every sample is exactly one of the two
    assert 0.45 < flipped.float().mean().item() < 0.55


def test_offsets_uniform_over_every_shift():
    """dy, dx take each of 0..2p (shifts -p..p) about equally often, independently."""
    draw = Augment(crop_padding=2).draw(20000, torch_generator(3, "aug"))
    for offsets in (draw.dy, draw.dx):
        freq = torch.bincount(offsets, minlength=6).float() / len(offsets)
        assert freq[5] == 0 and bool(((freq[:5] - 0.2).abs() < 0.015).all())
    assert abs(torch.corrcoef(torch.stack([draw.dy.float(), draw.dx.float()]))[0, 1]) < 0.03


def test_offset_equal_to_padding_is_identity():
    x = images()
    b = len(x)
    centre = torch.full((b,), 4, dtype=torch.long)
    draw = Draw(centre, centre, torch.zeros(b, dtype=torch.bool))
    assert torch.equal(crop_flip(x, 4, draw), x)
    # and any other offset is not (the crop moves the content)
    moved = Draw(centre + 1, centre, torch.zeros(b, dtype=torch.bool))
    assert not torch.equal(crop_flip(x, 4, moved), x)


def test_padding_is_zero():
    x = images() + 1.0  # strictly positive pixels
    b = len(x)
    corner = torch.zeros(b, dtype=torch.long)
    out = crop_flip(x, 2, Draw(corner, corner, torch.zeros(b, dtype=torch.bool)))
    assert (out[:, :, :2, :] == 0).all() and (out[:, :, :, :2] == 0).all()
    assert torch.equal(out[:, :, 2:, 2:], x[:, :, :-2, :-2])


def test_pure_input_not_modified():
    x = images()
    before = x.clone()
    for kind in ("cifar", "flip"):
        out = from_config(kind)(x, torch_generator(0))
        assert out.data_ptr() != x.data_ptr()
    assert torch.equal(x, before)


def test_no_padding_no_flip_draws_nothing():
    g = torch_generator(0)
    state = g.get_state()
    x = images()
    out = Augment(crop_padding=0, flip=False)(x, g)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()  # a new tensor even then
    assert torch.equal(g.get_state(), state)


def test_from_config_and_bad_input():
    assert from_config("none") is None
    assert from_config("cifar") == Augment(4, True)
    assert from_config("flip") == Augment(0, True)
    with pytest.raises(ConfigError, match="data.augment"):
        from_config("mixup")
    with pytest.raises(ConfigError, match="data.augment"):
        Augment(crop_padding=-1)
    with pytest.raises(ConfigError, match="data.augment"):
        Augment().check_input_shape((60,))
    Augment().check_input_shape((3, 32, 32))


def test_the_worker_augments_training_batches_only_and_deterministically():
    from tests.conftest import make_loop, tiny_config

    plain = make_loop(tiny_config("fedavg", model={"name": "cnn", "channels": [4], "fc": 16}))
    flipped = [
        make_loop(tiny_config("fedavg", data={"augment": "flip"}, model={"name": "cnn", "channels": [4], "fc": 16}))
        for _ in range(2)
    ]
    start = plain.init_state
    trained = [loop.client(0).fit(start) for loop in (plain, *flipped)]
    assert torch.equal(trained[1], trained[2])  # same keys, same flips
    assert not torch.equal(trained[0], trained[1])  # the flips changed training
    test = plain.worker.data.clients[0].test
    assert plain.worker.evaluate(trained[1], test).acc == flipped[0].worker.evaluate(trained[1], test).acc
    grad_plain, _ = plain.client(0).mean_gradient(start)
    grad_flip, _ = flipped[0].client(0).mean_gradient(start)
    assert torch.equal(grad_plain, grad_flip)  # a full-pass gradient upload is of the data itself

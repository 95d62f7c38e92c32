"""The model registry: every model builds, trains, flattens into per-layer slices and ends in its head."""

import math
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from pfl.engine.flat import FlatModule
from pfl.errors import ConfigError
from pfl.methods.heads import split_head
from pfl.models import ModelConfig, available_models, build_model, check_model_config, redrawn_params, register
from pfl.models.norms import norm_layers
from pfl.seeding import derive_seed

IMAGE = (3, 32, 32)
# name -> (ModelConfig overrides, input shape): every registered model must appear here (small widths).
REGISTERED = {
    "logreg": ({}, (3, 8, 8)),
    "mlp": ({"hidden": [16]}, (3, 8, 8)),
    "cnn": ({"channels": [4, 8], "fc": 16}, (3, 16, 16)),
    "cnn_bn": ({"channels": [4, 8], "fc": 16}, (3, 16, 16)),
    "fedpg_cnn": ({}, IMAGE),
    "lenet5": ({}, IMAGE),
    "fedora_cnn": ({}, IMAGE),
    "char_lstm": ({"hidden": [8], "embed": 4}, (12,)),
    "wrn28_10": ({"depth": 10, "widen": 1}, IMAGE),
}
# Backbones in their norm variants: (name, overrides, input shape).
BACKBONES = {
    "resnet18-bn": ("timm:resnet18", {}, IMAGE),
    "resnet18-gn": ("timm:resnet18", {"norm": "group"}, IMAGE),
    "resnet18-none": ("timm:resnet18", {"norm": "none"}, IMAGE),
    "wrn-gn": ("wrn28_10", {"depth": 10, "widen": 1, "norm": "group"}, IMAGE),
    "wrn-none": ("wrn28_10", {"depth": 10, "widen": 1, "norm": "none"}, IMAGE),
    "wrn-dropout": ("wrn28_10", {"depth": 10, "widen": 1, "dropout": 0.3}, IMAGE),
    "efficientnet-gn": ("timm:test_efficientnet", {"norm": "group"}, IMAGE),
    "lenet5-mnist": ("lenet5", {}, (1, 28, 28)),
}
CASES = {name: (name, *spec) for name, spec in REGISTERED.items()} | BACKBONES
WITH_BATCHNORM = {"cnn_bn", "wrn28_10", "resnet18-bn", "wrn-dropout"}
WITH_GROUPNORM = {"resnet18-gn", "wrn-gn", "efficientnet-gn"}
NUM_CLASSES = 7


def build(name, overrides, shape, num_classes=NUM_CLASSES, seed=0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(name=name, **overrides), shape, num_classes)


def batch(shape, n=4, num_classes=NUM_CLASSES):
    g = torch.Generator().manual_seed(1)
    x = (
        torch.randint(0, num_classes, (n, *shape), generator=g)
        if len(shape) == 1
        else torch.randn(n, *shape, generator=g)
    )
    return x, torch.randint(0, num_classes, (n,), generator=g)


def check_layer_slices(net: nn.Module, flat: FlatModule) -> None:
    """Disjoint, contiguous, covering all parameters; each slice holds exactly one module's own parameters."""
    layers = flat.layout.layer_slices()
    ordered = list(layers.values())
    assert ordered[0].start == 0 and ordered[-1].stop == flat.num_params
    for a, b in zip(ordered, ordered[1:], strict=False):
        assert a.stop == b.start and a.start < a.stop
    assert sum(p.numel() for p in net.parameters()) == flat.num_params
    for prefix, sl in layers.items():
        own = list(net.get_submodule(prefix).parameters(recurse=False))
        assert own and sum(p.numel() for p in own) == sl.stop - sl.start
        assert all(flat.params.untyped_storage().data_ptr() == p.untyped_storage().data_ptr() for p in own)


def test_every_registered_model_is_tested():
    assert set(available_models()) == set(REGISTERED)


@pytest.mark.parametrize("case", list(CASES))
def test_builds_trains_and_flattens(case):
    name, overrides, shape = CASES[case]
    net = build(name, overrides, shape)
    assert all(m.training for m in net.modules())  # built in train mode, like any fresh nn.Module
    for m in net.modules():  # building (shape probes included) leaves BatchNorm statistics at their init
        if isinstance(m, _BatchNorm):
            assert int(m.num_batches_tracked) == 0 and not m.running_mean.any() and (m.running_var == 1).all()
    flat = FlatModule(net)
    check_layer_slices(net, flat)
    # The head convention: the last layer slice is the final nn.Linear, and it is tail_slice(1).
    last = list(flat.layout.layer_slices())[-1]
    head = net.get_submodule(last)
    assert isinstance(head, nn.Linear) and head.out_features == NUM_CLASSES
    assert flat.layout.tail(1) == slice(flat.num_params - head.weight.numel() - head.bias.numel(), flat.num_params)
    # FedRoD's split reproduces the network: head(features(x)) is net(x), for every registered model.
    features, split = split_head(net)
    assert split is head
    net.eval()  # dropout and BatchNorm statistics stay put between the two forwards
    with torch.no_grad():
        x, _ = batch(shape)
        torch.testing.assert_close(split(features(x)), net(x), rtol=0, atol=0)
    # One SGD step on random data: finite loss, every gradient finite, the parameters and the head move.
    x, y = batch(shape)
    params, buffers = flat.params.clone(), flat.buffers.clone()
    opt = torch.optim.SGD(flat.tensors, lr=0.1)
    net.train()
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and torch.isfinite(flat.grads).all()
    assert not torch.equal(flat.params, params)
    assert not torch.equal(flat.params[flat.layout.tail(1)], params[flat.layout.tail(1)])
    has_bn = any(isinstance(m, _BatchNorm) for m in net.modules())
    assert has_bn == (case in WITH_BATCHNORM) and (flat.num_buffers > 0) == has_bn
    assert any(isinstance(m, nn.GroupNorm) for m in net.modules()) == (case in WITH_GROUPNORM)
    if has_bn:  # running statistics live in the flat state and moved with the train-mode forward
        assert not torch.equal(flat.buffers, buffers)


@pytest.mark.parametrize("name", [n for n in REGISTERED if n != "wrn28_10"] + ["wrn-gn"])
def test_same_seed_same_init(name):
    name, overrides, shape = CASES[name]
    a, b, c = (FlatModule(build(name, overrides, shape, seed=s)).params for s in (0, 0, 1))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_norm_choices():
    bn = build(*BACKBONES["resnet18-bn"][:3])
    gn = build(*BACKBONES["resnet18-gn"][:3])
    none = build(*BACKBONES["resnet18-none"][:3])
    n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in bn.modules())
    assert n_bn == 20  # resnet18: stem + 2 per block x 8 + 3 downsample
    assert not any(isinstance(m, _BatchNorm) for m in gn.modules())
    gns = [m for m in gn.modules() if isinstance(m, nn.GroupNorm)]
    assert len(gns) == n_bn and all(m.num_groups == 2 for m in gns)
    assert FlatModule(gn).num_buffers == 0 and FlatModule(bn).num_buffers > 0
    assert norm_layers(none) == [] and FlatModule(none).num_buffers == 0
    wrn_none = build(*BACKBONES["wrn-none"][:3])
    assert norm_layers(wrn_none) == []
    wrn_gn = build("wrn28_10", {"depth": 10, "widen": 2, "norm": "group", "groups": 4}, IMAGE)
    assert {m.num_groups for m in wrn_gn.modules() if isinstance(m, nn.GroupNorm)} == {4}


def test_groupnorm_swap_matches_timm_norm_layer():
    """Swapping BatchNorm after creation gives the modules timm's own norm_layer gives (ResNet)."""
    import timm

    swapped = build("timm:resnet18", {"norm": "group", "stem": "imagenet"}, IMAGE)[0]
    torch.manual_seed(0)
    native = timm.create_model(
        "resnet18", pretrained=False, num_classes=0, norm_layer=lambda c, **kw: nn.GroupNorm(2, c)
    )
    assert [(n, type(m), getattr(m, "num_groups", None)) for n, m in swapped.named_modules()] == [
        (n, type(m), getattr(m, "num_groups", None)) for n, m in native.named_modules()
    ]
    # timm zero-initialises each block's last norm; the swap keeps that
    assert torch.equal(swapped.layer1[0].bn2.weight, native.layer1[0].bn2.weight)
    assert swapped.layer1[0].bn2.weight.abs().sum() == 0


def test_resnet50_groupnorm():
    net = build("timm:resnet50", {"norm": "group"}, IMAGE)
    assert not any(isinstance(m, _BatchNorm) for m in net.modules())
    assert sum(isinstance(m, nn.GroupNorm) for m in net.modules()) == 53  # 1 + 3 x 16 blocks + 4 downsample
    assert FlatModule(net).num_buffers == 0
    assert isinstance(net[-1], nn.Linear) and net[-1].in_features == 2048


def test_fused_batchnorm_act_keeps_its_activation():
    bn = build("timm:test_efficientnet", {}, IMAGE)
    gn = build("timm:test_efficientnet", {"norm": "group"}, IMAGE)
    acts = (nn.ReLU, nn.SiLU, nn.Hardswish, nn.GELU)
    assert sum(isinstance(m, acts) for m in bn.modules()) == sum(isinstance(m, acts) for m in gn.modules()) > 0
    assert not any(isinstance(m, _BatchNorm) for m in gn.modules())


def first_conv(net):
    return next(m for m in net.modules() if isinstance(m, nn.Conv2d))


@pytest.mark.parametrize("name", ["timm:resnet18", "wrn28_10"])
def test_stems(name):
    small = {"depth": 10, "widen": 1} if name == "wrn28_10" else {}
    for stem, shape in [("cifar", IMAGE), ("auto", IMAGE), ("cifar", (3, 96, 96))]:
        net = build(name, {**small, "stem": stem}, shape)
        conv = first_conv(net)
        assert conv.kernel_size == (3, 3) and conv.stride == (1, 1)
        assert not any(isinstance(m, nn.MaxPool2d) for m in net.modules())
    for stem, shape in [("imagenet", IMAGE), ("auto", (3, 96, 96))]:
        net = build(name, {**small, "stem": stem}, shape)
        conv = first_conv(net)
        assert conv.kernel_size == (7, 7) and conv.stride == (2, 2)
        assert any(isinstance(m, nn.MaxPool2d) for m in net.modules())


def test_deep_stem_and_fallback():
    net = build("timm:test_resnet", {"stem": "cifar"}, IMAGE)  # deep stem: 3x3 convs, first one strided
    assert first_conv(net).stride == (1, 1) and not any(isinstance(m, nn.MaxPool2d) for m in net.modules())
    with pytest.raises(ConfigError, match="model.stem"):
        build("timm:test_efficientnet", {"stem": "cifar"}, IMAGE)
    assert first_conv(build("timm:test_efficientnet", {}, IMAGE)).stride == (2, 2)  # auto keeps its stem


def test_timm_options_in_channels():
    net = build("timm:resnet18", {"norm": "group"}, (1, 28, 28), num_classes=10)
    assert first_conv(net).in_channels == 1 and net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_small_models_parameter_counts():
    """The papers' architectures on 3x32x32 inputs and 10 classes, layer by layer (weights + biases)."""
    fedpg = (3 * 64 * 25 + 64) + (64 * 64 * 25 + 64) + (64 * 5 * 5 * 384 + 384) + (384 * 192 + 192) + (192 * 10 + 10)
    lenet = (3 * 6 * 25 + 6) + (6 * 16 * 25 + 16) + (16 * 5 * 5 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10)
    fedora = (3 * 16 * 25 + 16) + (16 * 32 * 25 + 32) + (32 * 5 * 5 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10)
    # FedAvg-CNN with BN: 5x5 'same' convs without bias (BN's shift replaces it), BN scale + shift.
    cnn_bn = (3 * 32 * 25 + 2 * 32) + (32 * 64 * 25 + 2 * 64) + (64 * 8 * 8 * 512 + 512) + (512 * 10 + 10)
    for name, expected in [("fedpg_cnn", fedpg), ("lenet5", lenet), ("fedora_cnn", fedora), ("cnn_bn", cnn_bn)]:
        net = build(name, {}, IMAGE, num_classes=10)
        assert sum(p.numel() for p in net.parameters()) == expected, name
    assert (
        sum(p.numel() for p in build("lenet5", {}, (1, 28, 28), num_classes=10)[1].parameters())
        == 16 * 4 * 4 * 120 + 120
    )


def test_wrn28_10_parameter_count():
    """WRN-28-10 as published: 36.5M parameters on CIFAR-10 (36,479,194)."""
    net = build("wrn28_10", {}, IMAGE, num_classes=10)
    assert sum(p.numel() for p in net.parameters()) == 36_479_194


@pytest.mark.parametrize(
    ("name", "overrides", "field", "static"),
    [
        ("nope", {}, "model.name", True),
        ("timm:not_a_model_xyz", {}, "model.name", False),
        ("cnn", {"norm": "group"}, "model.norm", True),
        ("cnn", {"stem": "cifar"}, "model.stem", True),
        ("timm:resnet18", {"depth": 16}, "model.depth", True),
        ("wrn28_10", {"norm": "layer"}, "model.norm", True),
        ("wrn28_10", {"stem": "big"}, "model.stem", True),
        ("wrn28_10", {"depth": 12}, "model.depth", True),
        ("wrn28_10", {"groups": 4}, "model.groups", True),
        ("wrn28_10", {"depth": 10, "norm": "group", "groups": 3}, "model.groups", False),
        ("timm:test_convnext", {"norm": "group"}, "model.norm", False),
        ("fedpg_cnn", {}, "model.name", False),  # 8x8 input: too small for two unpadded 5x5 convs
    ],
)
def test_bad_config(name, overrides, field, static):
    """Rejected with the field named; ``static`` ones already by check_model_config (config validation)."""
    cfg = ModelConfig(name=name, **overrides)
    if static:
        with pytest.raises(ConfigError) as err:
            check_model_config(cfg)
        assert err.value.field == field
    else:
        check_model_config(cfg)  # only building can tell
    with pytest.raises(ConfigError) as err:
        build(name, overrides, (3, 8, 8) if name == "fedpg_cnn" else IMAGE)
    assert err.value.field == field


USER_MODULE = """
import torch
from torch import nn


def builder(cfg, input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], num_classes))


class Net(nn.Sequential):
    def __init__(self, input_shape, num_classes):
        super().__init__(nn.Flatten(), nn.Linear(input_shape[0] * input_shape[1] * input_shape[2], num_classes))


not_a_model = 3


def returns_nothing(cfg, input_shape, num_classes):
    return None
"""


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    pkg = tmp_path / "usernets_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "usernets_pkg.nets"
    for mod in [m for m in sys.modules if m.startswith("usernets_pkg")]:
        del sys.modules[mod]


@pytest.mark.parametrize("attr", [":builder", ".builder", ":Net", ".Net"])
def test_user_model_by_import_path(user_package, attr):
    net = build(user_package + attr, {}, (3, 4, 4))
    assert isinstance(net[-1], nn.Linear) and net[-1].out_features == NUM_CLASSES
    assert net(torch.zeros(2, 3, 4, 4)).shape == (2, NUM_CLASSES)


@pytest.mark.parametrize("attr", [":missing", ".missing", ":not_a_model", ":returns_nothing"])
def test_user_model_errors(user_package, attr):
    with pytest.raises(ConfigError) as err:
        build(user_package + attr, {}, (3, 4, 4))
    assert err.value.field == "model.name" and (user_package + attr) in str(err.value)


def test_a_model_field_a_users_class_would_ignore_is_refused_naming_it(user_package):
    # A class is built from (input_shape, num_classes, **init_args) and never sees model.dropout: set, it
    # would be ignored without a word, so it is refused as for a registered model that does not read it.
    for field, value in (("dropout", 0.3), ("norm", "group"), ("depth", 16)):
        with pytest.raises(ConfigError) as err:
            build(user_package + ".Net", {field: value}, (3, 4, 4))
        assert err.value.field == f"model.{field}"
        assert "does not read" in str(err.value) and f"--model.init_args.{field}" in str(err.value)
    assert isinstance(build(user_package + ":builder", {"dropout": 0.3}, (3, 4, 4)), nn.Sequential)  # reads cfg


def test_user_model_missing_module():
    with pytest.raises(ConfigError) as err:
        build("no_such_pkg_xyz.nets:builder", {}, IMAGE)
    assert err.value.field == "model.name" and "no_such_pkg_xyz.nets:builder" in str(err.value)


def test_register_declares_its_options():
    @register("_tiny_for_test", "test model", options=("norm",))
    def _tiny(cfg, input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(4, num_classes))

    try:
        assert isinstance(build("_tiny_for_test", {"norm": "group"}, (4,)), nn.Sequential)
        with pytest.raises(ConfigError, match="model.stem"):
            build("_tiny_for_test", {"stem": "cifar"}, (4,))
        with pytest.raises(ValueError):
            register("_bad", "x", options=("widht",))
    finally:
        from pfl.models.registry import _REGISTRY

        _REGISTRY.pop("_tiny_for_test", None)


def frozen_stem_mlp(cfg, input_shape, num_classes):
    """An MLP whose first layer is frozen: FlatModule keeps only the trainable parameters."""
    net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 6), nn.ReLU(), nn.Linear(6, num_classes))
    net[1].requires_grad_(False)
    return net


@pytest.mark.parametrize("name", ["cnn_bn", "wrn28_10", "tests.models.test_models:frozen_stem_mlp"])
def test_redrawn_params_are_the_network_built_again_under_the_keyed_cpu_generator(name):
    overrides, shape = REGISTERED.get(name, ({}, (3, 4, 4)))
    cfg = ModelConfig(name=name, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        before = torch.get_rng_state()
        drawn = redrawn_params(cfg, shape, NUM_CLASSES, 0, "ifca", "cluster_start", 1)
        assert torch.equal(torch.get_rng_state(), before)  # the global generator is restored
        torch.manual_seed(derive_seed(0, "ifca", "cluster_start", 1))
        flat = FlatModule(build_model(cfg, shape, NUM_CLASSES))
    assert drawn.shape == (flat.num_params,) and torch.equal(drawn, flat.params)
    assert torch.equal(redrawn_params(cfg, shape, NUM_CLASSES, 0, "ifca", "cluster_start", 1), drawn)
    assert not torch.equal(redrawn_params(cfg, shape, NUM_CLASSES, 0, "ifca", "cluster_start", 2), drawn)

"""Models for the torch-integration benchmarks, built here and randomly initialized (nothing is downloaded).

    python benchmarks/models.py --smoke     # build, fx-trace and run each model on CPU in float32

- :func:`resnet50`: torchvision's ``resnet50(weights=None)`` when torchvision imports, else :class:`ResNet`, a local
  ResNet-50 v1.5 with torchvision's exact structure (module names, parameter shapes, initialization). The returned
  model says which in ``model.source`` (``"torchvision"`` or ``"local"``).
- :class:`MLPBlock`: LayerNorm -> Linear(d, 4d) -> GELU -> Linear(4d, d), plus the residual.
- :class:`GPT2Stack`: GPT-2-sized pre-LayerNorm decoder blocks on hidden states (batch, seq, d): fused qkv Linear,
  ``F.scaled_dot_product_attention(is_causal=True)``, output projection, MLP with ``nn.GELU``; final LayerNorm.
- :class:`ViT`: ViT-B/16's dimensions, every GEMM a Linear (patch embedding included).

Every model here traces with ``torch.fx.symbolic_trace``: no Python control flow on tensor values, and no reshape
that needs the traced sizes (heads are split with ``unflatten`` on the last dimension and merged with ``flatten``).
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

# --------------------------------------------------------------------------------------------------------------------
# ResNet-50 v1.5 (torchvision's structure: stride on the 3x3 convolution of the bottleneck)
# --------------------------------------------------------------------------------------------------------------------
RESNET50_PARAMETERS = 25_557_032  # torchvision.models.resnet50: sum(p.numel() for p in model.parameters())


def conv3x3(in_planes: int, out_planes: int, stride: int = 1, groups: int = 1, dilation: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=dilation, groups=groups, bias=False,
                     dilation=dilation)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None,
                 groups: int = 1, base_width: int = 64, dilation: int = 1, norm_layer=None):
        super().__init__()
        norm_layer = norm_layer or nn.BatchNorm2d
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = norm_layer(width)
        self.conv2 = conv3x3(width, width, stride, groups, dilation)
        self.bn2 = norm_layer(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = norm_layer(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)
        out = self.conv3(out)
        out = self.bn3(out)
        if self.downsample is not None:  # a module attribute, fixed at trace time
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    """torchvision.models.ResNet, Bottleneck blocks only (what ResNet-50 uses)."""

    def __init__(self, layers=(3, 4, 6, 3), num_classes: int = 1000, zero_init_residual: bool = False,
                 groups: int = 1, width_per_group: int = 64, norm_layer=None):
        super().__init__()
        norm_layer = norm_layer or nn.BatchNorm2d
        self._norm_layer = norm_layer
        self.inplanes = 64
        self.dilation = 1
        self.groups = groups
        self.base_width = width_per_group
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = norm_layer(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.constant_(m.bn3.weight, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        norm_layer = self._norm_layer
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * Bottleneck.expansion, stride),
                                       norm_layer(planes * Bottleneck.expansion))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample, self.groups, self.base_width, self.dilation,
                             norm_layer)]
        self.inplanes = planes * Bottleneck.expansion
        for _ in range(1, blocks):
            layers.append(Bottleneck(self.inplanes, planes, groups=self.groups, base_width=self.base_width,
                                     dilation=self.dilation, norm_layer=norm_layer))
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


def local_resnet50(num_classes: int = 1000) -> ResNet:
    model = ResNet((3, 4, 6, 3), num_classes=num_classes)
    model.source = "local"
    return model


def resnet50(prefer_torchvision: bool = True) -> nn.Module:
    """A randomly initialized ResNet-50; ``model.source`` is ``"torchvision"`` or ``"local"``."""
    if prefer_torchvision:
        try:
            import torchvision

            model = torchvision.models.resnet50(weights=None)
            model.source = "torchvision"
            return model
        except Exception:  # noqa: BLE001  (not installed, or an install that does not match torch)
            pass
    return local_resnet50()


@torch.no_grad()
def calibrate_batchnorm(model: nn.Module, inputs, steps: int = 3) -> nn.Module:
    """Give the BatchNorm layers running statistics from ``inputs`` (train-mode forwards, cumulative average), then
    return the model in eval mode. A freshly initialized network in eval mode has mean 0 / var 1 statistics and its
    activations grow layer after layer (large enough to lose precision or overflow in float16); calibrated, every
    BatchNorm normalizes as in a trained network."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average
    model.train()
    for _ in range(steps):
        model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)
    for m, momentum in zip(norms, saved):
        m.momentum = momentum
    return model.eval()


# --------------------------------------------------------------------------------------------------------------------
# Transformer pieces
# --------------------------------------------------------------------------------------------------------------------
ACTIVATIONS = {"gelu": lambda: nn.GELU(), "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
               "relu": lambda: nn.ReLU(), "silu": lambda: nn.SiLU()}


def activation_module(name: str) -> nn.Module:
    try:
        return ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {name!r}") from None


class MLPBlock(nn.Module):
    """``x + fc2(act(fc1(norm(x))))``: LayerNorm -> Linear(d, d_hidden) -> activation -> Linear(d_hidden, d)."""

    def __init__(self, d_model: int, d_hidden: int | None = None, activation: str = "gelu"):
        super().__init__()
        d_hidden = d_hidden or 4 * d_model
        self.norm = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_hidden)
        self.act = activation_module(activation)
        self.fc2 = nn.Linear(d_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class CausalSelfAttention(nn.Module):
    """Fused qkv projection, causal SDPA over ``n_heads`` heads, output projection. Input and output (b, s, d)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (b, s, 3d) -> (b, s, 3, h, hd) -> (3, b, h, s, hd); sizes only from constants, so fx traces it.
        qkv = self.qkv(x).unflatten(-1, (3, self.n_heads, self.head_dim)).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, h, s, hd)
        return self.proj(y.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    def __init__(self, d_model: int, d_hidden: int, activation: str = "gelu"):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_hidden)
        self.act = activation_module(activation)
        self.fc2 = nn.Linear(d_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class GPT2Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, activation: str = "gelu"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, 4 * d_model, activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2Stack(nn.Module):
    """``n_layers`` GPT-2 decoder blocks on hidden states (batch, seq, d_model), then a final LayerNorm.

    ``vocab``: when given, a language-model head Linear(d, vocab, bias=False) after the final LayerNorm (no
    embedding: the input stays hidden states). Initialization as GPT-2's: N(0, 0.02) weights, the residual
    projections scaled by 1/sqrt(2 n_layers); biases and LayerNorm affine parameters get small random values
    instead of GPT-2's constants, so that an implementation that drops a bias or a LayerNorm parameter shows."""

    def __init__(self, n_layers: int = 12, d_model: int = 768, n_heads: int = 12, vocab: int | None = None,
                 activation: str = "gelu"):
        super().__init__()
        self.blocks = nn.Sequential(*[GPT2Block(d_model, n_heads, activation) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False) if vocab else None
        self._init_weights(n_layers)

    @torch.no_grad()
    def _init_weights(self, n_layers: int) -> None:
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("attn.proj", "mlp.fc2")) else 0.02
                nn.init.normal_(m.weight, 0.0, std)
                if m.bias is not None:
                    nn.init.normal_(m.bias, 0.0, 0.02)
            elif isinstance(m, nn.LayerNorm):
                nn.init.normal_(m.weight, 1.0, 0.05)
                nn.init.normal_(m.bias, 0.0, 0.05)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_f(self.blocks(x))
        if self.head is not None:
            x = self.head(x)
        return x


class SelfAttention(nn.Module):
    """Fused qkv projection, (non-causal) SDPA over ``n_heads`` heads, output projection: every projection a Linear."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x).unflatten(-1, (3, self.n_heads, self.head_dim)).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(y.transpose(1, 2).flatten(2))


class ViTBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_hidden: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, eps=1e-6)
        self.attn = SelfAttention(d_model, n_heads)
        self.ln_2 = nn.LayerNorm(d_model, eps=1e-6)
        self.mlp = MLP(d_model, d_hidden, "gelu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    """A ViT-B/16 image classifier with torchvision's dimensions (patch 16, d 768, 12 layers, 12 heads, MLP 3072,
    class token, learned position embedding, 1000 classes). The patch embedding is the 16x16 stride-16 convolution
    written as a Linear over each patch's 768 pixels, and attention a fused qkv Linear + SDPA: every GEMM of the
    model is a Linear the model pass sees (torchvision's nn.MultiheadAttention hides its input projection)."""

    def __init__(self, image_size: int = 224, patch: int = 16, d_model: int = 768, n_layers: int = 12,
                 n_heads: int = 12, d_hidden: int = 3072, classes: int = 1000):
        super().__init__()
        self.patch, self.grid = patch, image_size // patch
        self.patch_embed = nn.Linear(3 * patch * patch, d_model)
        self.class_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.position = nn.Parameter(torch.randn(1, self.grid * self.grid + 1, d_model) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(d_model, n_heads, d_hidden) for _ in range(n_layers)])
        self.ln = nn.LayerNorm(d_model, eps=1e-6)
        self.head = nn.Linear(d_model, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        g, p = self.grid, self.patch
        # (b, 3, g*p, g*p) -> (b, g*g, 3*p*p): each patch's pixels, channel-major as the convolution reads them
        patches = images.unflatten(2, (g, p)).unflatten(4, (g, p)).permute(0, 2, 4, 1, 3, 5).flatten(3).flatten(1, 2)
        x = self.patch_embed(patches)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.position
        x = self.ln(self.blocks(x))
        return self.head(x[:, 0])


VIT_B16_PARAMETERS = 86_567_656  # torchvision.models.vit_b_16: the same count (its conv_proj has this Linear's size)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------------------------------------
# Smoke check (CPU, float32)
# --------------------------------------------------------------------------------------------------------------------
def _check(name: str, model: nn.Module, example: torch.Tensor, expect_params: int | None = None) -> None:
    model = model.eval()
    with torch.no_grad():
        eager = model(example)
    traced = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        again = traced(example)
    nodes = len(traced.graph.nodes)
    error = (again - eager).abs().max().item()
    params = parameter_count(model)
    ok = torch.isfinite(eager).all().item() and error == 0.0 and (expect_params is None or params == expect_params)
    print(f"{'ok ' if ok else 'BAD'} {name}: input {tuple(example.shape)} -> output {tuple(eager.shape)}, "
          f"{params:,} parameters{'' if expect_params is None else f' (expected {expect_params:,})'}, "
          f"fx graph {nodes} nodes, traced vs eager max abs diff {error:.3g}", flush=True)
    if not ok:
        raise SystemExit(f"smoke check failed for {name}")


def smoke() -> None:
    torch.manual_seed(0)
    model = resnet50()
    print(f"resnet50 source: {model.source}")
    example = torch.randn(2, 3, 64, 64)
    calibrate_batchnorm(model, (example,), steps=1)
    _check(f"resnet50 ({model.source})", model, example, RESNET50_PARAMETERS)
    if model.source != "local":  # the local copy against torchvision: same names and shapes
        local = local_resnet50()
        theirs = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        mine = {k: tuple(v.shape) for k, v in local.state_dict().items()}
        if theirs != mine:
            raise SystemExit("local ResNet-50 differs from torchvision's in its state_dict")
        print("ok  local resnet50 state_dict matches torchvision's (names and shapes)")
        _check("resnet50 (local)", calibrate_batchnorm(local, (example,), steps=1), example, RESNET50_PARAMETERS)
    # channels_last, as the benchmark runs it
    cl = model.to(memory_format=torch.channels_last)
    with torch.no_grad():
        cl(example.contiguous(memory_format=torch.channels_last))
    print("ok  resnet50 channels_last forward")
    for activation in ACTIVATIONS:
        _check(f"MLPBlock(64, 256, {activation!r})", MLPBlock(64, 256, activation), torch.randn(2, 8, 64))
    _check("MLPBlock(768) default d_hidden", MLPBlock(768), torch.randn(1, 4, 768), 768 * 2 + 768 * 3072 * 2 +
           3072 + 768)
    _check("GPT2Stack(2, 64, 4)", GPT2Stack(2, 64, 4), torch.randn(2, 16, 64))
    _check("GPT2Stack(2, 64, 4, vocab=100)", GPT2Stack(2, 64, 4, vocab=100), torch.randn(2, 16, 64))
    _check("GPT2Stack() (GPT-2 small, no embeddings)", GPT2Stack(), torch.randn(1, 8, 768), 85_056_000)
    _check("ViT(image 32, 2 layers)", ViT(image_size=32, n_layers=2), torch.randn(2, 3, 32, 32))
    _check("ViT() (ViT-B/16)", ViT(), torch.randn(1, 3, 224, 224), VIT_B16_PARAMETERS)
    # attention against a hand-written causal softmax
    attn = CausalSelfAttention(64, 4).eval()
    x = torch.randn(2, 10, 64)
    q, k, v = attn.qkv(x).split(64, dim=-1)
    heads = lambda t: t.view(2, 10, 4, 16).transpose(1, 2)  # noqa: E731
    scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(16)
    scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    manual = attn.proj((scores.softmax(-1) @ heads(v)).transpose(1, 2).reshape(2, 10, 64))
    error = (manual - attn(x)).abs().max().item()
    print(f"{'ok ' if error < 1e-5 else 'BAD'} CausalSelfAttention vs a hand-written causal attention: {error:.3g}")
    if error >= 1e-5:
        raise SystemExit("attention check failed")
    print("smoke check passed")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="build, fx-trace and run every model on CPU (float32)")
    args = parser.parse_args(argv)
    if args.smoke:
        smoke()
    else:
        parser.print_help()
        sys.exit(0)


if __name__ == "__main__":
    main()

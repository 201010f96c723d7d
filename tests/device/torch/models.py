"""ResNet-18 and GPT-2 small in plain torch.nn (no torchvision/transformers: the device has no network to fetch
them, and random weights need neither). Seeded by the caller."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=1000, width=64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for i, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
            layers += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        # Global average pooling as a mean: AdaptiveAvgPool2d's backward has no deterministic CUDA kernel.
        return self.fc(self.layers(self.stem(x)).mean(dim=(2, 3)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """GPT-2 small by default: 12 layers, 768 wide, 12 heads, 1024 positions, 50257 tokens, tied embedding."""

    def __init__(self, layers=12, d=768, heads=12, ctx=1024, vocab=50257):
        super().__init__()
        self.ctx = ctx
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("out.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.wte.weight.t()


def build(name):
    """(model, make_batch(generator, step) -> (input, target) on the host, loss_fn)."""
    if name in ("resnet18", "tiny_resnet"):
        tiny = name == "tiny_resnet"
        model = ResNet18(classes=10 if tiny else 1000, width=8 if tiny else 64)
        batch, size, classes = (4, 32, 10) if tiny else (64, 224, 1000)

        def make_batch(gen, step):
            return (torch.randn(batch, 3, size, size, generator=gen),
                    torch.randint(0, classes, (batch,), generator=gen))

        return model, make_batch, F.cross_entropy
    if name in ("gpt2", "gpt2_varlen", "tiny_gpt2"):
        tiny = name == "tiny_gpt2"
        model = GPT2(layers=2, d=64, heads=4, ctx=128, vocab=512) if tiny else GPT2()
        batch = 2 if tiny else 8
        vocab, ctx = (512, 128) if tiny else (50257, 1024)

        def make_batch(gen, step):
            t = ctx
            if name == "gpt2_varlen":   # a new sequence length each step: the allocator sees new sizes
                t = int(torch.randint(64, ctx + 1, (1,), generator=gen))
            tokens = torch.randint(0, vocab, (batch, t + 1), generator=gen)
            return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

        def loss_fn(logits, target):
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), target.view(-1))

        return model, make_batch, loss_fn
    raise ValueError(f"unknown model {name!r}")

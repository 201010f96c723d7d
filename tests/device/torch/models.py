"""ResNet-18 and GPT-2 small in plain torch.nn, and from transformers (built from configs with random weights:
the device has no network) BERT-base with shapes per step, a Mixtral-style mixture of experts and GPT-2
generation. Seeded by the caller."""

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
    if name in ("bert_varlen", "mixtral_moe"):
        return _transformers_trainee(name)
    if name == "gpt2_generate":
        return _generation_loop()
    raise ValueError(f"unknown model {name!r}")


def _draw(gen, lo, hi):
    """An integer in [lo, hi] from the host generator `gen`."""
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


class LogitsOf(nn.Module):
    """A transformers model as train.py calls a model: tokens in, logits out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(input_ids=x).logits


def _token_loss(logits, target):
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), target.reshape(-1))


def _transformers_trainee(name):
    """BERT-base masked LM with batch (8-32) and length (32-512) drawn per step, or a
    Mixtral-style mixture of experts (6 layers, 8 experts, top-2) with about 8k tokens a step, length drawn."""
    import transformers

    if name == "bert_varlen":
        config = transformers.BertConfig()   # bert-base: 12 layers, 768 wide, 30522 tokens
        model = transformers.BertForMaskedLM(config)
    else:
        config = transformers.MixtralConfig(hidden_size=1024, intermediate_size=1792, num_hidden_layers=6,
                                            num_attention_heads=16, num_key_value_heads=4, num_local_experts=8,
                                            num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=4096)
        model = transformers.MixtralForCausalLM(config)
    vocab = config.vocab_size

    def make_batch(gen, step):
        def draw(lo, hi):
            return _draw(gen, lo, hi)
        if name == "bert_varlen":
            batch, length = draw(8, 32), draw(32, 512)
        else:
            length = draw(256, 2048)
            batch = max(1, 8192 // length)
        tokens = torch.randint(0, vocab, (batch, length + 1), generator=gen)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    return LogitsOf(model), make_batch, _token_loss


class GenerationLoop(nn.Module):
    """GPT-2 small greedy generation: train.py runs `step(prompt, new_tokens)` as the step, without gradients."""

    generates = True

    def __init__(self):
        super().__init__()
        import transformers
        self.model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()   # no dropout: inference

    def step(self, prompt, new_tokens):
        out = self.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        return out.float().mean()


def _generation_loop():
    """Prompts of batch 1-16 and 16-300 tokens, 16-48 new tokens each: the key/value cache grows every token."""
    def make_batch(gen, step):
        def draw(lo, hi):
            return _draw(gen, lo, hi)
        batch, prompt, new = draw(1, 16), draw(16, 300), draw(16, 48)
        return torch.randint(0, 50257, (batch, prompt), generator=gen), torch.tensor([new])

    return GenerationLoop(), make_batch, None

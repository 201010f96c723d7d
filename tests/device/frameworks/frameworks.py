"""Real frameworks that ask PyTorch about memory, under PyTorch's allocator or strata's backend; prints the
losses ("LOSSES [...]") for the runner to compare, and what the framework reported ("METRICS {...}"):
  trainer    transformers' Trainer on a GPT-2 built from its config (random weights, no network), with its
             memory metrics on (skip_memory_metrics=False: reset_peak_memory_stats, max_memory_allocated ...)
  lightning  PyTorch Lightning with DeviceStatsMonitor (torch.cuda.memory_stats every batch)
    python3 tests/device/frameworks/frameworks.py --allocator strata|native --framework trainer|lightning
"""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import allocator_from_argv  # noqa: E402

allocator_from_argv()
import torch  # noqa: E402

args = sys.argv[1:]
framework = args[args.index("--framework") + 1]
STEPS, VOCAB, SEQ, BATCH = 10, 512, 64, 8
torch.backends.cuda.matmul.allow_tf32 = False
gen = torch.Generator().manual_seed(1)
samples = [torch.randint(0, VOCAB, (SEQ,), generator=gen) for _ in range(STEPS * BATCH)]


def trainer():
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    transformers.set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    data = [{"input_ids": s, "labels": s} for s in samples]
    out = tempfile.mkdtemp()
    targs = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=STEPS, logging_steps=1,
                              skip_memory_metrics=False, report_to=[], save_strategy="no", seed=0,
                              dataloader_num_workers=0, learning_rate=1e-3, lr_scheduler_type="constant")
    t = Trainer(model=model, args=targs, train_dataset=data)
    result = t.train()
    losses = [h["loss"] for h in t.state.log_history if "loss" in h]
    metrics = {k: v for k, v in result.metrics.items() if "mem" in k}
    return losses, metrics


def lightning():
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import DeviceStatsMonitor
    from pytorch_lightning.loggers import CSVLogger
    from torch import nn

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, 128)
            self.layer = nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
            self.head = nn.Linear(128, VOCAB)
            self.losses = []

        def training_step(self, batch, _):
            logits = self.head(self.layer(self.embed(batch[:, :-1])))
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            self.losses.append(loss.item())
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    pl.seed_everything(0)
    module = Module()
    loader = torch.utils.data.DataLoader(torch.stack(samples), batch_size=BATCH, shuffle=False)
    save = tempfile.mkdtemp()
    trainer = pl.Trainer(max_steps=STEPS, accelerator="gpu", devices=1, callbacks=[DeviceStatsMonitor()],
                         logger=CSVLogger(save), enable_checkpointing=False, enable_progress_bar=False,
                         log_every_n_steps=1, enable_model_summary=False)
    trainer.fit(module, loader)
    columns = set()
    for root, _, files in os.walk(save):
        for f in files:
            if f == "metrics.csv":
                with open(os.path.join(root, f)) as fh:
                    columns |= set(fh.readline().strip().split(","))
    stats = sorted(c for c in columns if "allocated_bytes.all.current" in c or "reserved_bytes.all.peak" in c)
    return module.losses, {"device_stats_columns": stats}


losses, metrics = {"trainer": trainer, "lightning": lightning}[framework]()
print("METRICS " + json.dumps(metrics))
print("LOSSES " + json.dumps(losses), flush=True)

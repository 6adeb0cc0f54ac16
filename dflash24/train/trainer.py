"""`dflash24 train-draft`: train a DFlash drafter for a GGUF target (FACTS.md 3b recipe).

Frozen target (no grad): one forward per training sequence gives the features of `target_layer_ids`
for all positions (and its logits when the KL term is on). Random anchors per sequence (512 per 2K
tokens by default, scaled down for shorter ones), all trained in one batched forward
(`objective.train_forward`); loss = CE on the target's tokens at block positions 1..B-1, weighted by
exp(-(k-1)/gamma), + optional forward KL to the target's distribution. The target's embedding and LM head
are used frozen (the LM head dequantized to a dense tensor). AdamW, linear warmup + cosine decay, bf16
autocast on CUDA (fp32 on CPU), gradient clipping. Checkpoints (`<out>/checkpoint.pt`: weights, optimizer,
scheduler, step, data cursor, RNG) resume exactly. Output: z-lab layout (`config.json` + `model.safetensors`)
with the target's file name and sha256 in `dflash_config`.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..gguf.reader import GGUFFile
from ..models import load_target
from ..models.drafter import FULL, DFlashConfig, default_target_layer_ids, load_safetensors
from ..models.layers import Step
from ..models.loading import Loader
from .data import Sequence, usable
from .objective import (DraftParams, block_loss, default_anchor_count, expected_acceptance, position_weights,
                        train_forward_batch)

log = logging.getLogger("dflash24.train")


class TrainError(ValueError):
    pass


@dataclass
class TrainConfig:
    model: str                                   # target GGUF
    out: str                                     # output directory (drafter + checkpoint + log)
    layers: int = 3
    ffn_dim: int | None = None                   # default: the target's
    block: int = 16
    target_layer_ids: tuple[int, ...] | None = None   # default: z-lab's formula for `layers` captures
    mask_token_id: int | None = None             # default: vocab_size - 1
    lr: float = 6e-4
    warmup: float = 0.04                         # fraction of the steps
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    steps: int | None = None                     # default: epochs over the data
    epochs: float = 6.0
    batch_size: int = 1                          # sequences per optimizer step (gradient accumulation)
    micro_batch: int = 4                         # sequences per drafter forward (padded to the longest)
    anchors: int = 512                           # per max_len-token sequence
    max_len: int = 2048
    gamma: float = 7.0
    kl_weight: float = 0.0
    labels: str = "tokens"                       # tokens: the sequence's next tokens (target-generated data);
                                                 # target: the target's greedy next token (any text)
    seed: int = 0
    device: str | None = None
    save_every: int = 500                        # checkpoint + exported drafter every this many steps
    max_minutes: float | None = None             # stop (checkpoint + export) once this much time has passed
    minutes: float | None = None                 # train for this long: warmup + cosine decay follow the clock
    init: str | None = None                      # start from an exported drafter (config.json + model.safetensors)
    feature_cache: str | None = None             # directory: the target's features / greedy tokens, computed once
    log_every: int = 1
    progress: bool = True
    storage_dtype: str = "bfloat16"              # model.safetensors dtype

    def __post_init__(self):
        """Refuse settings no run can use, naming the flag, before any data is generated or loaded."""
        def need(ok: bool, flag: str, value, what: str):
            if not ok:
                raise TrainError(f"--{flag} must be {what}, got {value}")

        for flag, value, low in (("layers", self.layers, 1), ("block", self.block, 2),
                                 ("batch-size", self.batch_size, 1), ("micro-batch", self.micro_batch, 1),
                                 ("anchors", self.anchors, 1),
                                 ("max-len", self.max_len, self.block + 2), ("save-every", self.save_every, 1),
                                 ("steps", 1 if self.steps is None else self.steps, 1),
                                 ("ffn", 1 if self.ffn_dim is None else self.ffn_dim, 1)):
            need(value >= low, flag, value, f"at least {low}")
        for flag, value in (("lr", self.lr), ("epochs", self.epochs), ("gamma", self.gamma),
                            ("minutes", 1 if self.minutes is None else self.minutes)):
            need(0 < value < math.inf, flag, value, "a finite positive number")
        for flag, value in (("kl", self.kl_weight),
                            ("max-minutes", 0 if self.max_minutes is None else self.max_minutes)):   # 0: one step
            need(0 <= value < math.inf, flag, value, "a finite number >= 0")
        if self.labels not in ("tokens", "target"):
            raise TrainError(f"labels must be tokens or target, got {self.labels!r}")
        if self.init and not all((Path(self.init) / f).is_file() for f in ("config.json", "model.safetensors")):
            raise TrainError(f"--init {self.init}: needs config.json and model.safetensors (a drafter written by "
                             f"train-draft)")

    def torch_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def drafter_config(tc: TrainConfig, target_cfg) -> DFlashConfig:
    t = target_cfg
    ids = tuple(tc.target_layer_ids or default_target_layer_ids(t.n_layers, tc.layers))
    if max(ids) >= t.n_layers:
        raise TrainError(f"target_layer_ids {ids} outside the target's {t.n_layers} layers")
    return DFlashConfig(
        n_layers=tc.layers, dim=t.dim, ffn_dim=tc.ffn_dim or t.ffn_dim, n_heads=t.n_heads, n_kv_heads=t.n_kv_heads,
        head_dim=t.head_dim, norm_eps=1e-6, rope_theta=float(getattr(t, "rope_theta", 1e6)),
        max_positions=max(int(getattr(t, "context_length", 32768)), tc.max_len + tc.block),
        vocab_size=t.vocab_size, target_layer_ids=ids, block_size=tc.block,
        mask_token_id=t.vocab_size - 1 if tc.mask_token_id is None else tc.mask_token_id,
        layer_types=(FULL,) * tc.layers, sliding_window=None, causal=(False,) * tc.layers,
        n_target_layers=t.n_layers)


def init_state(path: str, cfg: DFlashConfig) -> dict[str, torch.Tensor]:
    """The weights of an exported drafter to continue training from; its layout must be the one this run
    builds (same layers, captured target layers, block, mask token, sizes)."""
    d = Path(path)                                     # TrainConfig checked that it holds both files
    got = DFlashConfig.from_file(d / "config.json")
    keys = ("n_layers", "dim", "ffn_dim", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "target_layer_ids",
            "block_size", "mask_token_id")
    diff = [f"{k} {getattr(got, k)} != {getattr(cfg, k)}" for k in keys if getattr(got, k) != getattr(cfg, k)]
    if diff:
        raise TrainError(f"--init {d}: a different drafter layout than this run's: {'; '.join(diff)}")
    return load_safetensors(d / "model.safetensors")


def lm_head_weight(gf: GGUFFile, cfg, device, dtype) -> torch.Tensor:
    """The target's LM head as a dense [vocab, dim] tensor (tied files: the token embedding)."""
    name = "output.weight" if "output.weight" in gf.tensors else "token_embd.weight"
    return Loader(gf, device, dtype).dense(name, (cfg.vocab_size, cfg.dim), dtype=dtype)


def densify_target(model, dtype, device, share: float = 0.25) -> bool:
    """Dequantize the frozen target's packed layers once when they fit in `share` of the free GPU memory:
    every training forward is a large-M matmul, which would otherwise dequantize each weight again
    (about 10 % of a 0.5B target's training step on an H200, benchmarks/profile_train.py)."""
    from ..quant.linear import QuantLinear
    layers = [m for m in model.modules() if isinstance(m, QuantLinear) and m.packed is not None]
    need = sum(m.in_features * m.out_features for m in layers) * dtype.itemsize
    from ..plan import cuda_budget
    free = cuda_budget(device)
    if not layers or need > share * free:
        if layers:
            log.info("train-draft: the target stays packed (dense: %.1f GiB, free: %.1f GiB)", need / 2**30,
                     free / 2**30)
        return False
    for m in layers:
        m.densify(dtype)
    torch.cuda.empty_cache()
    log.info("train-draft: target dequantized once for training (%.2f GiB)", need / 2**30)
    return True


def lr_lambda(step: int, total: int, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / max(warmup, 1)
    t = (step - warmup) / max(total - warmup, 1)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))


class Trainer:
    def __init__(self, tc: TrainConfig, seqs: list[Sequence], target=None, gguf: GGUFFile | None = None):
        self.tc = tc
        self.device = tc.torch_device()
        self.gf = gguf or GGUFFile(tc.model)
        self.target_dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.target = target if target is not None else load_target(self.gf, self.device, self.target_dtype,
                                                                    max_positions=tc.max_len + tc.block + 16)
        if target is None and self.device.type == "cuda":
            densify_target(self.target, self.target_dtype, self.device)
        self.seqs = [Sequence(s.ids[:tc.max_len], s.prompt_len, s.finish) for s in usable(seqs, tc.block)]
        self.seqs = [s for s in self.seqs if len(s.ids) - s.prompt_len >= 2]
        if not self.seqs:
            raise TrainError("no usable training sequences (each needs a prompt and >= 2 response tokens)")
        self.cfg = drafter_config(tc, self.target.cfg)
        self.params = DraftParams(self.cfg, init_state(tc.init, self.cfg) if tc.init else None,
                                  seed=tc.seed).to(self.device)
        self.lm_head = lm_head_weight(self.gf, self.target.cfg, self.device,
                                      torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.weights = position_weights(tc.block, tc.gamma, self.device)
        self.fcache = self._feature_cache() if tc.feature_cache else None
        per_epoch = math.ceil(len(self.seqs) / tc.batch_size)
        self.total_steps = tc.steps or max(1, math.ceil(tc.epochs * per_epoch))
        self.opt = torch.optim.AdamW(self.params.parameters(), lr=tc.lr, betas=tc.betas,
                                     weight_decay=tc.weight_decay)
        self.trained_s, self._t0 = 0.0, None           # training time of earlier runs (checkpoint) / this run's start
        self.until_time_up = tc.minutes is not None and tc.steps is None    # no step count: as many as fit
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self.lr_factor)
        self.gen = torch.Generator().manual_seed(tc.seed)
        self.step, self.epoch, self.cursor = 0, 0, 0
        self.order = torch.randperm(len(self.seqs), generator=self.gen).tolist()
        self.out = Path(tc.out)

    def elapsed_s(self) -> float:
        """Training time so far, earlier (resumed) runs included."""
        return self.trained_s + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)

    def lr_factor(self, step: int) -> float:
        """Warmup then cosine decay over the steps, or, with --minutes, over the training time: a run whose
        speed is not known in advance still ends its schedule when its time is up."""
        tc = self.tc
        if tc.minutes is None:
            return lr_lambda(step, self.total_steps, int(tc.warmup * self.total_steps), tc.min_lr_ratio)
        scale = 10_000                                 # the clock's fraction as a step count of a fixed total
        done = int(scale * min(self.elapsed_s() / (60 * tc.minutes), 1.0))
        return lr_lambda(done, scale, int(tc.warmup * scale), tc.min_lr_ratio)

    def time_up(self) -> bool:
        tc = self.tc
        limits = [m for m in (tc.max_minutes, tc.minutes) if m is not None]
        return bool(limits) and self.elapsed_s() >= 60 * min(limits)

    def _feature_cache(self):
        from .features import FeatureCache
        from .fingerprint import target_sha256
        if self.tc.kl_weight > 0:
            raise TrainError("--feature-cache keeps the target's greedy tokens, not its distributions: "
                             "it cannot be used with --kl")
        ids = tuple(self.cfg.target_layer_ids)
        return FeatureCache(self.tc.feature_cache, target_sha256=target_sha256(self.tc.model), layers=ids,
                            dtype=self.target_dtype, width=len(ids) * self.target.cfg.dim, seqs=self.seqs,
                            with_next=self.tc.labels == "target")

    # -- pieces ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def features(self, ids: torch.Tensor, want_logits: bool):
        """Frozen target over ids [T]: (features [T, n_capture*dim], logits [T, V] or None)."""
        T = ids.shape[0]
        cache = self.target.new_cache(T + 1, self.target_dtype, self.device)
        h, f = self.target(ids, Step.sequential(0, T, device=self.device), cache, tuple(self.cfg.target_layer_ids))
        return f, (self.target.logits(h) if want_logits else None)

    def anchors(self, seq: Sequence) -> torch.Tensor:
        """Sorted random anchor positions of one sequence (a CPU tensor)."""
        T, P = len(seq.ids), seq.prompt_len
        cand = T - 1 - P                            # anchors P .. T-2: at least one response label each
        n = default_anchor_count(cand, T, self.tc.anchors, self.tc.max_len)
        pick = torch.randperm(cand, generator=self.gen)[:n] + P
        return pick.sort().values

    def to_device(self, items: list[tuple[Sequence, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(ids, anchors) of each (sequence, CPU anchors) on the device, in one pinned copy: a copy from pageable
        memory waits for all queued GPU work first, and one per sequence would drain the queue each time."""
        parts = [torch.tensor(s.ids, dtype=torch.long) for s, _ in items] + [a for _, a in items]
        flat = torch.cat(parts)
        if self.device.type == "cuda":
            flat = flat.pin_memory()
        flat = flat.to(self.device, non_blocking=True)
        out = list(flat.split([p.numel() for p in parts]))
        return list(zip(out[:len(items)], out[len(items):]))

    def sequence_loss(self, seq: Sequence, anchors: torch.Tensor | None = None, index: int | None = None):
        """(loss, stats) of one sequence; anchors: CPU positions (default: drawn here); index: its place in
        self.seqs (reads / fills the feature cache)."""
        anchors = self.anchors(seq) if anchors is None else anchors.cpu()
        (ids, anchors_dev), = self.to_device([(seq, anchors)])
        return self._batch_loss([(index, ids, anchors_dev, int(anchors.max()) if anchors.numel() else 0)])

    def target_side(self, ids: torch.Tensor, index: int | None):
        """(features, greedy next tokens or None, target logits or None) of one sequence: from the feature
        cache when it holds the sequence, else from the target (and then written to the cache)."""
        greedy_labels = self.tc.labels == "target"
        if self.fcache is not None and index is not None and self.fcache.has(index):
            f, g = self.fcache.get(index)
            pin = self.device.type == "cuda"
            f = (f.pin_memory() if pin else f).to(self.device, non_blocking=True)
            if g is not None:
                g = (g.pin_memory() if pin else g).to(self.device, non_blocking=True)
            return f, g, None
        feats, tlogits = self.features(ids, self.tc.kl_weight > 0 or greedy_labels)
        greedy = torch.cat([ids[:1], tlogits[:-1].argmax(-1)]) if greedy_labels else None
        if self.fcache is not None and index is not None:
            self.fcache.put(index, feats, greedy)
        return feats, greedy, tlogits

    def _batch_loss(self, items: list[tuple[int | None, torch.Tensor, torch.Tensor, int]]):
        """(loss, stats) of sequences (index, ids, anchors, n_ctx) in ONE drafter forward: the target runs
        per sequence (no grad), the drafter on all of them together; the loss is the mean over the sequences
        of each one's weighted mean over its labelled block positions."""
        B, S = self.cfg.block_size, len(items)
        feats, labels, tls = [], [], []
        for index, ids, anchors, _ in items:
            f, greedy, tlogits = self.target_side(ids, index)
            T = ids.shape[0]
            pos = anchors[:, None] + torch.arange(1, B, device=self.device)[None, :]          # [N, B-1]
            # label of position p: the sequence's token p, or the target's greedy choice after ids[:p]
            nxt = ids if self.tc.labels == "tokens" else greedy
            feats.append(f)
            labels.append(torch.where(pos < T, nxt[pos.clamp(max=T - 1)], torch.full_like(pos, -100)))
            want_kl = tlogits is not None and self.tc.kl_weight > 0     # (the feature cache refuses --kl)
            tls.append(tlogits[(pos - 1).clamp(max=T - 1)] if want_kl else None)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            logits = train_forward_batch(self.params, feats, [it[1] for it in items], [it[2] for it in items],
                                         self.target.token_embd, self.lm_head, [it[3] for it in items])
        Nm = logits.shape[1]
        lab = torch.full((S, Nm, B - 1), -100, dtype=torch.long, device=self.device)   # padding anchors: no label
        tl = None
        if tls[0] is not None:
            tl = torch.zeros(S, Nm, B - 1, logits.shape[-1], dtype=tls[0].dtype, device=self.device)
        for s in range(S):
            lab[s, :labels[s].shape[0]] = labels[s]
            if tl is not None:
                tl[s, :tls[s].shape[0]] = tls[s]
        # each sequence's weighted mean, averaged over the sequences (as if each ran alone)
        per_seq = ((lab >= 0) * self.weights).sum((1, 2)).clamp(min=1e-8)                    # [S]
        block_weight = (1.0 / (S * per_seq))[:, None].expand(S, Nm).reshape(-1)
        return block_loss(logits.flatten(0, 1), lab.flatten(0, 1), self.weights,
                          tl.flatten(0, 1) if tl is not None else None, self.tc.kl_weight, block_weight)

    def _next_index(self) -> int:
        if self.cursor >= len(self.order):
            self.epoch += 1
            self.cursor = 0
            self.order = torch.randperm(len(self.seqs), generator=self.gen).tolist()
        i = self.order[self.cursor]
        self.cursor += 1
        return i

    def train_step(self) -> dict:
        """One optimizer step over batch_size sequences. The GPU queue is never drained inside the step: the
        inputs go over in one copy and the statistics stay on the device until the step's end."""
        self.params.train()
        self.opt.zero_grad(set_to_none=True)
        index, batch = [], []
        for _ in range(self.tc.batch_size):
            index.append(self._next_index())
            seq = self.seqs[index[-1]]
            batch.append((seq, self.anchors(seq)))
        tot, stats_all = 0.0, []
        on_device = self.to_device(batch)
        mb = max(1, self.tc.micro_batch)
        for k in range(0, len(batch), mb):              # each micro-batch: one drafter forward + backward
            items = [(i, ids, anchors, int(a.max()) if a.numel() else 0)
                     for i, (ids, anchors), (_, a) in zip(index[k:k + mb], on_device[k:k + mb], batch[k:k + mb])]
            loss, stats = self._batch_loss(items)
            share = len(items) / self.tc.batch_size
            (loss * share).backward()
            tot = tot + loss.detach() * share
            stats_all.append(stats)
        gnorm = torch.nn.utils.clip_grad_norm_(self.params.parameters(), self.tc.clip)
        lr = self.sched.get_last_lr()[0]
        self.opt.step()
        self.sched.step()
        self.step += 1
        n = torch.stack([s["n_pos"] for s in stats_all]).float()                # [batch, B-1]
        acc_pos = ((torch.stack([s["acc_pos"] for s in stats_all]) * n).sum(0) / n.sum(0).clamp(min=1)).tolist()
        accepted = torch.stack([s["accepted"] for s in stats_all]).mean()        # per micro-batch, then averaged
        return {"step": self.step, "epoch": self.epoch, "loss": round(float(tot), 5), "lr": lr,
                "grad_norm": round(float(gnorm), 4), "accepted": round(float(accepted), 4),
                "al_est": round(expected_acceptance(acc_pos), 4), "acc_pos": [round(a, 4) for a in acc_pos]}

    # -- checkpoints and export -----------------------------------------------------------------------
    def state(self) -> dict:
        return {"params": self.params.state_dict(), "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                "step": self.step, "epoch": self.epoch, "cursor": self.cursor, "order": self.order,
                "gen": self.gen.get_state(), "torch_rng": torch.get_rng_state(), "trained_s": self.elapsed_s(),
                "config": {k: v for k, v in asdict(self.tc).items()}, "n_seqs": len(self.seqs)}

    def save_checkpoint(self, path: Path | None = None) -> Path:
        if self.fcache is not None:
            self.fcache.sync()
        path = Path(path or self.out / "checkpoint.pt")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(self.state(), tmp)
        tmp.replace(path)
        return path

    def load_checkpoint(self, path: Path | None = None):
        path = Path(path or self.out / "checkpoint.pt")
        if not path.is_file():
            raise TrainError(f"{path}: no checkpoint to resume from")
        try:                       # tensors and plain data only: a checkpoint cannot run code as it loads
            st = torch.load(path, map_location=self.device, weights_only=True)
        except Exception as e:     # noqa: BLE001 -- torch raises many types for a damaged or foreign file
            raise TrainError(f"{path}: not a checkpoint this trainer can resume from ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from e
        if not isinstance(st, dict) or not {"n_seqs", "params", "opt", "sched", "step"} <= st.keys():
            raise TrainError(f"{path}: not a checkpoint written by dflash24 train-draft")
        if st["n_seqs"] != len(self.seqs):
            raise TrainError(f"{path}: checkpoint was trained on {st['n_seqs']} sequences, now {len(self.seqs)}")
        self.params.load_state_dict(st["params"])
        self.opt.load_state_dict(st["opt"])
        self.sched.load_state_dict(st["sched"])
        self.step, self.epoch, self.cursor, self.order = st["step"], st["epoch"], st["cursor"], st["order"]
        self.trained_s = float(st.get("trained_s", 0.0))
        self.gen.set_state(st["gen"].cpu())                # map_location moved it with the tensors
        torch.set_rng_state(st["torch_rng"].cpu())

    def export(self, out_dir: Path | None = None) -> Path:
        """config.json + model.safetensors (z-lab layout) + the target's identity in dflash_config."""
        from safetensors.torch import save_file
        from .fingerprint import target_sha256
        out = Path(out_dir or self.out)
        out.mkdir(parents=True, exist_ok=True)
        c = self.cfg.to_hf()
        c["dflash_config"]["target_model"] = Path(self.tc.model).name
        c["dflash_config"]["target_sha256"] = target_sha256(self.tc.model)
        c["dflash_config"]["training"] = {"steps": self.step, "anchors": self.tc.anchors, "gamma": self.tc.gamma,
                                          "lr": self.tc.lr, "sequences": len(self.seqs)}
        (out / "config.json").write_text(json.dumps(c, indent=2))
        save_file(self.params.export(getattr(torch, self.tc.storage_dtype)), str(out / "model.safetensors"))
        return out

    def fit(self, log_path: Path | None = None) -> list[dict]:
        log_path = Path(log_path or self.out / "train_log.jsonl")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            from tqdm import tqdm
            bar = tqdm(total=None if self.until_time_up else self.total_steps, initial=self.step, desc="train-draft",
                       disable=not self.tc.progress)
        except ImportError:
            bar = None
        records = []
        self._t0 = time.perf_counter()
        with open(log_path, "a") as f:
            while self.step < self.total_steps or self.until_time_up:
                rec = self.train_step()
                rec["elapsed_s"] = round(self.elapsed_s(), 2)
                records.append(rec)
                if self.step % self.tc.log_every == 0 or self.step == self.total_steps:
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=rec["loss"], al=rec["al_est"])
                if self.step % self.tc.save_every == 0:
                    self.save_checkpoint()
                    self.export()                   # a run killed later still leaves a usable drafter
                if self.time_up():
                    log.warning("train-draft: time limit reached at step %d (%.1f minutes of training)",
                                self.step, self.elapsed_s() / 60)
                    break
        if bar is not None:
            bar.close()
        self.save_checkpoint()
        return records


def train_main(args) -> int:
    """The CLI entry (`dflash24 train-draft`)."""
    from ..config import EngineConfig
    from ..engine import Engine
    from .data import GenSettings, answer_sequences, generate_sequences, sharegpt_pairs, sharegpt_prompts
    model = args.model
    if model is None:
        from ..default_model import default_model_path
        model = str(default_model_path())
    out = Path(args.out)
    data_dir = Path(args.data_dir) if args.data_dir else out / "data"
    settings = GenSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                           max_len=args.max_len)
    tc = TrainConfig(model=model, out=str(out), layers=args.layers, ffn_dim=args.ffn, block=args.block,
                     lr=args.lr, steps=args.steps, epochs=args.epochs, batch_size=args.batch_size,
                     micro_batch=args.micro_batch, anchors=args.anchors, max_len=args.max_len, gamma=args.gamma,
                     kl_weight=args.kl, labels="target" if args.responses == "sharegpt" else "tokens",
                     seed=args.seed, device=args.device, save_every=args.save_every, max_minutes=args.max_minutes,
                     minutes=args.minutes, init=args.init, feature_cache=args.feature_cache)
    for flag, value in (("gen-batch", args.gen_batch), ("n-prompts", args.n_prompts)):
        if value is not None and value < 1:
            raise TrainError(f"--{flag} must be at least 1, got {value}")
    out.mkdir(parents=True, exist_ok=True)    # an --out that cannot be a directory fails here, before any work
    if args.responses == "sharegpt":          # no generation: ShareGPT's answers, the target's greedy labels
        pairs = sharegpt_pairs(args.n_prompts, path=args.sharegpt)
        log.warning("train-draft: %d ShareGPT prompts with their own answers; labels from the target", len(pairs))
        from ..gguf.template import ChatTemplate
        from ..gguf.tokenizer import Tokenizer
        gf = GGUFFile(model)
        seqs = answer_sequences(Tokenizer.from_gguf(gf), ChatTemplate.from_gguf(gf), pairs, args.max_len)
    else:
        prompts = sharegpt_prompts(args.n_prompts, path=args.sharegpt)
        log.warning("train-draft: %d ShareGPT prompts; generating responses with the target (cached in %s)",
                    len(prompts), data_dir)
        engine = Engine(EngineConfig(model=model, ctx=args.max_len + 64, device=args.device))
        batch = args.gen_batch or (64 if engine.device.type == "cuda" else 1)
        seqs = generate_sequences(engine, prompts, settings, data_dir, model, batch=batch)
        del engine
    trainer = Trainer(tc, seqs)
    if args.resume:
        trainer.load_checkpoint()
    trainer.fit()
    trainer.export()
    print(f"drafter written to {out} ({trainer.step} steps); use: dflash24 run --model {model} --draft {out}")
    return 0

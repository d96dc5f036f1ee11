"""PyTorch reference of flashgpt's GPT for the oracle tests, written from the model description
(pre-LayerNorm GPT-2 blocks, GQA by repeating key/value heads, tanh GELU, LayerNorm eps 1e-5,
head tied to the token embedding, vocabulary padded to a multiple of 128 and sliced off here),
plus the training step: grad accumulation, clip_grad_norm_, the learning-rate schedule of
optim/optim.h and torch.optim.AdamW.

Positions: learned (wpe), rope (half-split rotation of q and k, angles pos * theta^(-2d/HS), as
GPT-NeoX and Hugging Face Llama's rotate_half; with model.rope_dims = R > 0 only the pairs d < R/2
turn, at pos * theta^(-2d/R), as GPT-NeoX's rotary_pct) or alibi (-slope_h * (i - j), slopes
2^(-8h/NH)).
attention.window applies to the layers l with l % attention.window_every == 0. With
attention.doc_mask a new document starts after every data.eot_token: the mask is built here
explicitly from document ids (token i sees token j only in the same document), and positions
restart at 0 in each document."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LN_EPS = 1e-5


class RefGPT(nn.Module):
    def __init__(self, cfg, weights, dtype=torch.float64):
        """cfg: the run config (dict of sections); weights: {gpt_tensor name: numpy array}."""
        super().__init__()
        m = cfg["model"]
        self.L, self.NH, self.NKV, self.C, self.V = (m["n_layer"], m["n_head"], m["n_kv_head"],
                                                    m["n_embd"], m["vocab_size"])
        self.HS = self.C // self.NH
        self.window = cfg["attention"]["window"]
        self.window_every = cfg["attention"]["window_every"]
        self.pos = m["pos_embedding"]
        self.theta = m["rope_theta"]
        self.rope_dims = m["rope_dims"] or self.HS
        self.eot = cfg["data"]["eot_token"] if cfg["attention"]["doc_mask"] else -1
        self.names = list(weights)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.tensor(w, dtype=dtype)) for w in weights.values()])

    def p(self, name):
        return self.weights[self.index[name]]

    def named_weights(self):
        return zip(self.names, self.weights)

    def _ln(self, x, prefix):
        return F.layer_norm(x, (self.C,), self.p(prefix + ".weight"), self.p(prefix + ".bias"), LN_EPS)

    def _linear(self, x, prefix):
        return F.linear(x, self.p(prefix + ".weight"), self.p(prefix + ".bias"))

    def documents(self, tokens):
        """(doc id, position within the document), both (B, T) int64."""
        B, T = tokens.shape
        starts = torch.zeros(B, T, dtype=torch.long)
        if self.eot >= 0:
            starts[:, 1:] = (tokens[:, :-1] == self.eot).long()
        doc = starts.cumsum(dim=1)                             # (B, T)
        t = torch.arange(T).expand(B, T)
        first = (t * starts).cummax(dim=1).values              # (B, T) start of t's document
        return doc, t - first

    def _rope(self, x, pos):
        """x (B, H, T, HS) rotated by pos (B, T): rotate_half form."""
        half, R = self.HS // 2, self.rope_dims
        d = torch.arange(half, dtype=torch.float64)
        inv_freq = torch.where(d < R // 2, self.theta ** (-2.0 * d / R), 0.0)   # 0: never rotated
        ang = pos.to(torch.float64)[:, None, :, None] * inv_freq   # (B, 1, T, HS/2)
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _attention(self, x, l, doc, pos):
        B, T, _ = x.shape
        NH, NKV, HS = self.NH, self.NKV, self.HS
        qkv = self._linear(x, f"h.{l}.attn.qkv")               # (B, T, (NH + 2 NKV) HS)
        q, k, v = qkv.split([NH * HS, NKV * HS, NKV * HS], dim=-1)
        q = q.view(B, T, NH, HS).transpose(1, 2)               # (B, NH, T, HS)
        k = k.view(B, T, NKV, HS).transpose(1, 2)              # (B, NKV, T, HS)
        if self.pos == "rope":
            q, k = self._rope(q, pos), self._rope(k, pos)
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.view(B, T, NKV, HS).transpose(1, 2).repeat_interleave(NH // NKV, dim=1)
        att = q @ k.transpose(-2, -1) / math.sqrt(HS)          # (B, NH, T, T)
        i = torch.arange(T).view(T, 1)
        j = torch.arange(T).view(1, T)
        if self.pos == "alibi":
            slopes = 2.0 ** (-8.0 * torch.arange(1, NH + 1, dtype=torch.float64) / NH)
            att = att - (slopes.view(NH, 1, 1) * (i - j)).to(att.dtype)
        visible = (j <= i).expand(B, 1, T, T)                  # (B, 1, T, T)
        if self.window >= 0 and l % self.window_every == 0:
            visible = visible & (j >= i - self.window)
        visible = visible & (doc[:, None, :, None] == doc[:, None, None, :])
        att = att.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * HS)  # (B, T, C)
        return self._linear(y, f"h.{l}.attn.proj")

    def forward(self, tokens, targets):
        """tokens, targets (B, T) int64 (targets < 0 ignored) -> logits (B, T, V), mean loss."""
        doc, pos = self.documents(tokens)                      # (B, T) each
        x = self.p("wte")[tokens]                              # (B, T, C)
        if self.pos == "learned":
            x = x + self.p("wpe")[pos]
        for l in range(self.L):
            x = x + self._attention(self._ln(x, f"h.{l}.ln1"), l, doc, pos)
            h = F.gelu(self._linear(self._ln(x, f"h.{l}.ln2"), f"h.{l}.mlp.fc"), approximate="tanh")
            x = x + self._linear(h, f"h.{l}.mlp.proj")
        x = self._ln(x, "lnf")
        logits = x @ self.p("wte")[:self.V].t()               # padded rows never reach a logit
        loss = F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1), ignore_index=-1)
        return logits, loss


def lr_at(optim, step, total):
    """The schedule documented at lr_at in optim/optim.h."""
    lr, min_lr, warmup = optim["lr"], optim["min_lr"], optim["warmup_steps"]
    if step < warmup:
        return lr * (step + 1) / warmup
    if optim["schedule"] == "constant":
        return lr
    span = total - 1 - warmup
    progress = min(1.0, (step - warmup) / span) if span > 0 else 1.0
    if optim["schedule"] == "linear":
        return lr - (lr - min_lr) * progress
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def train_reference(model, cfg, inputs, targets, decayed):
    """Runs cfg's train.steps optimizer steps on micro-batches inputs/targets (steps*accum, B, T);
    returns per-step (mean loss, lr, unclipped grad norm) lists."""
    o, steps, accum = cfg["optim"], cfg["train"]["steps"], cfg["train"]["grad_accum"]
    decay = [w for n, w in model.named_weights() if n in decayed]
    no_decay = [w for n, w in model.named_weights() if n not in decayed]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    losses, lrs, norms = [], [], []
    for s in range(steps):
        lr = lr_at(o, s, steps)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        total = 0.0
        for k in range(accum):
            i = s * accum + k
            _, loss = model(torch.as_tensor(inputs[i]).long(), torch.as_tensor(targets[i]).long())
            (loss / accum).backward()
            total += loss.item()
        params = list(model.parameters())
        if o["grad_clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, o["grad_clip"]).item()
        else:
            norm = torch.norm(torch.stack([p.grad.norm() for p in params])).item()
        opt.step()
        losses.append(total / accum)
        lrs.append(lr)
        norms.append(norm)
    return losses, lrs, norms

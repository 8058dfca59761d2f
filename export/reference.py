# reference.py: the Kimi-Linear decode block written down literally from the
# spec in float64 (or float32) PyTorch, rounding to bf16 exactly where the
# spec and ktune's oracle (kernels/kimi/oracle.cc) round, to validate the
# exported module against. Also what a validation needs around it: seeded
# weights, states and tokens, safetensors files without the safetensors
# package, and similarity measures. Slow on purpose: it favours being
# obviously right.
import hashlib
import json
import math
import pathlib
import struct

import torch
import torch.nn.functional as F

# ---- safetensors ---------------------------------------------------------------

_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
           "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


def read_safetensors(path):
    """(tensors, metadata) of a safetensors file; the tensors are CPU views of one buffer."""
    data = bytearray(pathlib.Path(path).stat().st_size)
    with open(path, "rb") as f:
        f.readinto(data)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        if end == begin:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
        else:
            size = torch.empty(0, dtype=dtype).element_size()
            tensors[name] = torch.frombuffer(data, dtype=dtype, count=(end - begin) // size,
                                             offset=8 + n + begin).reshape(info["shape"])
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    names = {v: k for k, v in _DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        blob = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


# ---- seeded inputs -----------------------------------------------------------------

def _stream(seed, name):
    """A generator seed for one named tensor of one seed (independent of order)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") >> 1


def _normal(shape, std, seed, name, dtype, device):
    g = torch.Generator().manual_seed(_stream(seed, name))
    return (torch.randn(shape, generator=g) * std).to(dtype).to(device)


def make_state(cfg, seed, context, device="cpu"):
    """The spec's pre-filled state for a seed: S ~ N(0, 0.05^2) fp32; conv
    windows, c_kv and k_rope ~ N(0, 0.1^2) bf16, `context` cached rows."""
    h, d, ch = cfg["kda_heads"], cfg["kda_head_dim"], cfg["kda_heads"] * cfg["kda_head_dim"]
    state = []
    for i, kind in enumerate(cfg["pattern"]):
        p = f"state.{i}."
        if kind == "K":
            windows = {w: _normal((3, ch), 0.1, seed, p + w, torch.bfloat16, device) for w in ("cq", "ck", "cv")}
            state.append({"S": _normal((h, d, d), 0.05, seed, p + "S", torch.float32, device), **windows})
        else:
            state.append({"c_kv": _normal((context, cfg["kv_lora"]), 0.1, seed, p + "c_kv", torch.bfloat16, device),
                          "k_rope": _normal((context, cfg["qk_rope"]), 0.1, seed, p + "k_rope", torch.bfloat16,
                                            device)})
    return state


def make_token(cfg, seed, device="cpu"):
    """The input token, bf16 [hidden] ~ N(0, 0.25^2)."""
    return _normal((cfg["hidden"],), 0.25, seed, "token", torch.bfloat16, device)


def random_weights(like, seed, device):
    """Weights per the spec's recipe, for every tensor of `like` (a state dict
    giving the names, shapes and dtypes): norms 1; beta_proj and router
    N(0, 0.02^2); conv_w N(0, 0.1^2); W4A16 matrices drawn N(0, 0.02^2) and
    quantized per group of rows and per column, asymmetric."""
    out = {}
    for name, t in like.items():
        if name.endswith("_norm"):
            out[name] = torch.ones(t.shape, dtype=t.dtype, device=device)
        elif name.endswith((".beta_proj.weight", ".router.weight", ".conv_w")):
            std = 0.1 if name.endswith(".conv_w") else 0.02
            g = torch.Generator(device=device).manual_seed(_stream(seed, name))
            out[name] = (torch.randn(t.shape, generator=g, device=device) * std).to(t.dtype)
        elif name.endswith(".w_q"):
            base = name[:-len(".w_q")]
            *lead, half, n = t.shape
            groups = like[base + ".scales"].shape[-2]
            g = torch.Generator(device=device).manual_seed(_stream(seed, base))
            w = (torch.randn(*lead, groups, 2 * half // groups, n, generator=g, device=device) * 0.02)
            wmin, wmax = w.amin(dim=-2, keepdim=True), w.amax(dim=-2, keepdim=True)
            scale = (wmax - wmin).clamp(min=1e-8) / 15
            zero = torch.round(-wmin / scale).clamp(0, 15)
            q = torch.round(w / scale + zero).clamp(0, 15).to(torch.uint8).reshape(*lead, 2 * half, n)
            out[name] = q[..., 0::2, :] | (q[..., 1::2, :] << 4)
            out[base + ".scales"] = scale.squeeze(-2).to(torch.bfloat16)
            out[base + ".zeros"] = zero.squeeze(-2).to(torch.bfloat16)
    return out


# ---- comparing -------------------------------------------------------------------------

def similarity(got, want):
    """Cosine, relative L2 error and the count of non-finite values of `got` against `want`."""
    a, b = got.detach().double().reshape(-1).cpu(), want.detach().double().reshape(-1).cpu()
    nonfinite = int((~torch.isfinite(a)).sum())
    a = torch.nan_to_num(a)
    cos = float(a @ b / (a.norm() * b.norm())) if a.norm() > 0 and b.norm() > 0 else float(a.norm() == b.norm())
    rel = float((a - b).norm() / b.norm()) if b.norm() > 0 else float(a.norm())
    return {"cosine": cos, "rel_l2": rel, "nonfinite": nonfinite}


# ---- the block ---------------------------------------------------------------------------

def _bf16(x):
    """x rounded to bf16, kept in its dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


def dequantize(w_q, scales, zeros, dtype):
    """w[k, n] = (q[k, n] - zeros[k/group, n]) * scales[k/group, n], each step
    rounded to bf16 (q - zero is a small integer, so only the product rounds)."""
    *lead, half, n = w_q.shape
    groups = scales.shape[-2]
    q = torch.stack((w_q & 15, w_q >> 4), dim=-2).reshape(*lead, groups, 2 * half // groups, n).float()
    w = ((q - zeros.float().unsqueeze(-2)) * scales.float().unsqueeze(-2)).to(torch.bfloat16)
    return w.reshape(*lead, 2 * half, n).to(dtype)


class _Block:
    """One step's computation over a state dict `w` in precision `dtype`."""

    def __init__(self, cfg, weights, dtype):
        self.c, self.w, self.dtype = cfg, weights, dtype

    def matrix(self, name, experts=None):
        parts = [self.w[f"{name}.{p}"] for p in ("w_q", "scales", "zeros")]
        if experts is not None:
            parts = [p[experts] for p in parts]
        return dequantize(*parts, self.dtype)

    def linear(self, x, name):
        """A W4A16 linear: output rounded to bf16."""
        return _bf16(x @ self.matrix(name))

    def vector(self, name):
        return self.w[name].to(self.dtype)

    def rms_norm(self, x, name):
        eps = self.c.get("rms_eps", 1e-6)
        return _bf16(x * torch.rsqrt((x * x).mean() + eps) * self.vector(name))

    def kda(self, p, xn, st):
        c = self.c
        h, d = c["kda_heads"], c["kda_head_dim"]
        conv_w = self.vector(p + "conv_w")  # [3, C, 4]
        acts, windows = [], {}
        for idx, (proj, name) in enumerate((("q_proj", "cq"), ("k_proj", "ck"), ("v_proj", "cv"))):
            raw = self.linear(xn, p + proj)
            win = torch.cat((st[name].to(self.dtype), raw[None]))  # [4, C], oldest row first
            acts.append(_bf16(F.silu((win.t() * conv_w[idx]).sum(-1))))
            windows[name] = win[1:].to(torch.bfloat16)
        q, k, v = (a.view(h, d) for a in acts)
        g = -F.softplus(self.linear(xn, p + "g_proj")).view(h, d)
        beta = torch.sigmoid(_bf16(xn @ self.vector(p + "beta_proj.weight").t()))
        s = st["S"].to(self.dtype) * torch.exp(g).unsqueeze(-1)          # decay along the key dim
        pred = torch.einsum("hij,hi->hj", s, k)
        s = s + k.unsqueeze(-1) * (beta.unsqueeze(-1) * (v - pred)).unsqueeze(1)
        o = _bf16(torch.einsum("hij,hi->hj", s, q) * d ** -0.5)           # from the updated S
        return self.linear(o.reshape(-1), p + "o_proj"), {"S": s.float(), **windows}

    def rope(self, x, pos):
        """Rotates pairs (x[2i], x[2i+1]) by pos * theta^(-2i/n); rounded to bf16."""
        n = x.shape[-1]
        inv = torch.tensor([self.c["rope_theta"] ** (-2.0 * i / n) for i in range(n // 2)], dtype=torch.float64)
        a = (pos * inv).to(x.device)
        cos, sin = torch.cos(a).to(self.dtype), torch.sin(a).to(self.dtype)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return _bf16(torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2))

    def mla(self, p, xn, st):
        c = self.c
        h, nope, rope, r, vh = c["mla_heads"], c["qk_nope"], c["qk_rope"], c["kv_lora"], c["v_head"]
        pos = st["c_kv"].shape[0]
        q = self.linear(xn, p + "q_proj").view(h, nope + rope)
        kv = self.linear(xn, p + "kv_a")
        q_nope, q_rope = q[:, :nope], self.rope(q[:, nope:], pos)
        c_kv = torch.cat((st["c_kv"], kv[:r].to(torch.bfloat16)[None]))
        k_rope = torch.cat((st["k_rope"], self.rope(kv[r:], pos).to(torch.bfloat16)[None]))
        # The spec's form: every cached row through kv_b (a W4A16 linear, so
        # k_nope and v round to bf16), then softmax attention per head.
        kvb = _bf16(c_kv.to(self.dtype) @ self.matrix(p + "kv_b")).view(pos + 1, h, nope + vh)
        scores = (torch.einsum("hd,thd->th", q_nope, kvb[..., :nope]) +
                  k_rope.to(self.dtype) @ q_rope.t()) * (1 / math.sqrt(nope + rope))
        o = _bf16(torch.einsum("th,thd->hd", torch.softmax(scores, dim=0), kvb[..., nope:]))
        return self.linear(o.reshape(-1), p + "o_proj"), {"c_kv": c_kv, "k_rope": k_rope}

    def moe(self, p, hn):
        c = self.c
        logits = _bf16(hn @ self.vector(p + "router.weight").t())     # rounded before the softmax
        # Ranked by logit, ties ordered as PyTorch's CPU top-k orders them
        # (what the oracle and the kernels do; softmax keeps the order).
        idx = torch.topk(logits.float().cpu(), c["n_active"]).indices.tolist()
        probs = torch.softmax(logits, dim=0)
        w = probs[idx] / (probs[idx].sum() + 1e-9) * c["routed_scaling"]

        def ffn(prefix, experts):  # gate, up and down in full precision, no rounding in between
            gate = torch.einsum("k,ekn->en", hn, self.matrix(p + prefix + "gate", experts))
            up = torch.einsum("k,ekn->en", hn, self.matrix(p + prefix + "up", experts))
            return torch.einsum("ek,ekn->en", F.silu(gate) * up, self.matrix(p + prefix + "down", experts))

        out = (w.unsqueeze(-1) * ffn("", idx)).sum(0) + ffn("s_", None).sum(0)
        return _bf16(out), idx

    def step(self, hidden, state):
        x = hidden.reshape(-1).to(self.dtype)
        new_state, topk = [], []
        for i, kind in enumerate(self.c["pattern"]):
            p = f"blocks.{i}."
            xn = self.rms_norm(x, p + "attn_norm")
            attn, st = (self.kda if kind == "K" else self.mla)(p + "attn.", xn, state[i])
            h = _bf16(x + attn)
            moe, idx = self.moe(p + "moe.", self.rms_norm(h, p + "moe_norm"))
            x = _bf16(h + moe)
            new_state.append(st)
            topk.append(idx)
        return x.to(torch.bfloat16), new_state, topk


def reference_step(cfg, weights, hidden, state, dtype=torch.float64):
    """One decode step from `hidden` (bf16 [hidden]) and `state` (left
    untouched). Returns (hidden bf16, new state with the MLA cache one row
    longer, the routed experts of each layer, best first). `weights` maps the
    spec's names to tensors; the work happens on hidden's device."""
    cfg = dict(cfg, pattern="".join(cfg["pattern"]))
    dev = hidden.device
    weights = {k: v.to(dev) for k, v in weights.items() if k.startswith("blocks.")}
    state = [{k: v.to(dev) for k, v in layer.items()} for layer in state]
    return _Block(cfg, weights, dtype).step(hidden, state)

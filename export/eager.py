# eager.py: the same decode block written the way a careful PyTorch user
# would, for benchmarks only: bf16 activations, each W4A16 weight
# dequantized to bf16 right before its matmul (fp32 accumulation inside the
# bf16 matmul), the MoE batched (the routed and shared experts' weights
# gathered, dequantized together and applied with bmm), the MLA in its
# absorbed form. The rounding points that decide the experts (bf16 router
# logits, an fp32 softmax) are the spec's. It loads the same state dict as
# solution.Model and takes and returns the same state; one step is a few
# hundred kernel launches.
import math

import torch
import torch.nn.functional as F

from solution import KimiParams

BF16 = torch.bfloat16


def dequantize(w):
    """A W4A16 matrix (or stack) as bf16: (q - zero) * scale in bf16
    arithmetic, each operation rounded to bf16 as the spec says."""
    return dequantize_parts(w.w_q, w.scales, w.zeros)


def dequantize_parts(w_q, scales, zeros):
    *lead, half, n = w_q.shape
    groups = scales.shape[-2]
    q = torch.stack((w_q & 15, w_q >> 4), dim=-2).view(*lead, groups, 2 * half // groups, n).to(BF16)
    return ((q - zeros.unsqueeze(-2)) * scales.unsqueeze(-2)).view(*lead, 2 * half, n)


def rms_norm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(BF16)


class EagerModel(KimiParams):
    """step(hidden, state) -> (hidden, state), as solution.Model: KDA tensors
    updated in place, the MLA cache returned one row longer."""

    def step(self, hidden, state):
        c = self.cfg
        x = hidden.reshape(1, -1)
        new_state = []
        for blk, kind, st in zip(self.blocks, c["pattern"], state):
            xn = rms_norm(x, blk.attn_norm, c["rms_eps"])
            if kind == "K":
                attn = self.kda(blk.attn, xn, st)
                new_state.append(st)
            else:
                attn, st = self.mla(blk.attn, xn, st)
                new_state.append(st)
            h = x + attn
            x = h + self.moe(blk.moe, rms_norm(h, blk.moe_norm, c["rms_eps"]))
        return x.view_as(hidden), new_state

    def kda(self, a, xn, st):
        c = self.cfg
        heads, dim = c["kda_heads"], c["kda_head_dim"]
        acts = []
        for idx, (proj, name) in enumerate(((a.q_proj, "cq"), (a.k_proj, "ck"), (a.v_proj, "cv"))):
            raw = xn @ dequantize(proj)                                       # [1, C]
            win = torch.cat((st[name], raw))                                  # [4, C], oldest first
            acts.append(F.silu((win.float() * a.conv_w[idx].float().t()).sum(0)).to(BF16))
            st[name].copy_(win[1:])
        q, k, v = (t.float().view(heads, dim) for t in acts)
        g = -F.softplus((xn @ dequantize(a.g_proj)).float()).view(heads, dim)
        beta = torch.sigmoid(F.linear(xn, a.beta_proj.weight).float()).view(heads, 1)
        s = st["S"]
        s.mul_(torch.exp(g).unsqueeze(-1))                                   # decay along the key dim
        pred = torch.bmm(k.unsqueeze(1), s).squeeze(1)                        # [H, D]
        s.baddbmm_(k.unsqueeze(-1), (beta * (v - pred)).unsqueeze(1))
        o = torch.bmm(q.unsqueeze(1), s).squeeze(1) * dim ** -0.5             # from the updated S
        return o.to(BF16).view(1, -1) @ dequantize(a.o_proj)

    def rope(self, x, pos):
        n = x.shape[-1]
        cache = getattr(self, "_inv_freq", None)
        if cache is None or cache.device != x.device:
            self._inv_freq = cache = (self.cfg["rope_theta"] ** (
                -2.0 * torch.arange(n // 2, dtype=torch.float64) / n)).to(x.device)
        angle = cache * pos
        cos, sin = angle.cos().float(), angle.sin().float()
        x0, x1 = x[..., 0::2].float(), x[..., 1::2].float()
        return torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2).to(BF16)

    def mla(self, a, xn, st):
        c = self.cfg
        heads, nope, rdim, lat, vh = c["mla_heads"], c["qk_nope"], c["qk_rope"], c["kv_lora"], c["v_head"]
        pos = st["c_kv"].shape[0]
        q = (xn @ dequantize(a.q_proj)).view(heads, nope + rdim)
        kv = (xn @ dequantize(a.kv_a)).view(-1)
        q_rope = self.rope(q[:, nope:], pos)
        c_kv = torch.cat((st["c_kv"], kv[None, :lat]))
        k_rope = torch.cat((st["k_rope"], self.rope(kv[lat:], pos)[None]))
        # Absorbed: scores against the latent cache directly.
        w_kvb = dequantize(a.kv_b).view(lat, heads, nope + vh)
        q_abs = torch.einsum("rhd,hd->hr", w_kvb[..., :nope].float(), q[:, :nope].float())   # [H, R]
        cache = c_kv.float()
        scores = (q_abs @ cache.t() + q_rope.float() @ k_rope.float().t()) / math.sqrt(nope + rdim)
        o_lat = torch.softmax(scores, dim=-1) @ cache                                          # [H, R]
        o = torch.einsum("hr,rhd->hd", o_lat, w_kvb[..., nope:].float()).to(BF16)
        return o.view(1, -1) @ dequantize(a.o_proj), {"c_kv": c_kv, "k_rope": k_rope}

    def moe(self, m, hn):
        c = self.cfg
        probs = torch.softmax(F.linear(hn, m.router.weight).float(), dim=-1)   # bf16 logits, fp32 softmax
        w, idx = torch.topk(probs, c["n_active"], dim=-1)
        w = w / (w.sum(-1, keepdim=True) + 1e-9) * c["routed_scaling"]
        idx = idx[0]

        def experts(routed, shared):  # the routed experts' matrices and the shared ones, one bf16 batch
            return dequantize_parts(*(torch.cat((getattr(routed, p)[idx], getattr(shared, p)))
                                      for p in ("w_q", "scales", "zeros")))

        n = c["n_active"] + c["n_shared"]
        xs = hn.expand(n, 1, hn.shape[-1])
        gate = torch.bmm(xs, experts(m.gate, m.s_gate))
        up = torch.bmm(xs, experts(m.up, m.s_up))
        act = (F.silu(gate.float()) * up.float()).to(BF16)
        y = torch.bmm(act, experts(m.down, m.s_down)).float().squeeze(1)         # [n, hidden]
        coef = F.pad(w[0], (0, c["n_shared"]), value=1.0)                          # shared experts weigh 1
        return (coef.unsqueeze(-1) * y).sum(0, keepdim=True).to(BF16)

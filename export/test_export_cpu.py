# test_export_cpu.py: the CPU check of an exported module (ktune's CI runs it
# through tests/agent_export_test.cc with Debian's python3-torch). It imports
# the written solution.py without building any CUDA code, builds Model(cfg)
# for the exported config and for a small one, and checks that the state
# dict names are exactly the spec's (generated here, independently, from the
# spec's naming rules), with the spec's shapes and dtypes and ktune's weight
# specs (variant.json), and that a state dict loads with strict=True. With
# --golden it also checks reference.py and eager.py against the golden
# vectors.
# Usage: python3 test_export_cpu.py EXPORT_DIR [--golden GOLDEN_DIR]
import argparse
import json
import pathlib
import sys
import tempfile

import torch

FAILURES = []


def check(ok, what):
    print(("ok:   " if ok else "FAIL: ") + what)
    if not ok:
        FAILURES.append(what)


# ---- the spec's names and shapes (SPEC-kimi-linear.md), written out here ----

def w4(base, k, n, lead=()):
    return {f"{base}.w_q": (torch.uint8, lead + (k // 2, n)),
            f"{base}.scales": (torch.bfloat16, lead + (k // 128, n)),
            f"{base}.zeros": (torch.bfloat16, lead + (k // 128, n))}


def spec_tensors(c):
    """name -> (dtype, shape) for every weight the spec names."""
    d, ch, i, e = c["hidden"], c["kda_heads"] * 128, c["moe_inter"], c["n_experts"]
    out = {}
    for layer, kind in enumerate(c["pattern"]):
        b = f"blocks.{layer}."
        out[b + "attn_norm"] = (torch.bfloat16, (d,))
        out[b + "moe_norm"] = (torch.bfloat16, (d,))
        if kind == "K":
            for p in ("q_proj", "k_proj", "v_proj", "g_proj"):
                out.update(w4(b + "attn." + p, d, ch))
            out.update(w4(b + "attn.o_proj", ch, d))
            out[b + "attn.beta_proj.weight"] = (torch.bfloat16, (c["kda_heads"], d))
            out[b + "attn.conv_w"] = (torch.bfloat16, (3, ch, 4))
        else:
            h = c["mla_heads"]
            out.update(w4(b + "attn.q_proj", d, h * (128 + 64)))
            out.update(w4(b + "attn.kv_a", d, c["kv_lora"] + 64))
            out.update(w4(b + "attn.kv_b", c["kv_lora"], h * (128 + 128)))
            out.update(w4(b + "attn.o_proj", h * 128, d))
        out[b + "moe.router.weight"] = (torch.bfloat16, (e, d))
        for p, k, n in (("gate", d, i), ("up", d, i), ("down", i, d)):
            out.update(w4(f"{b}moe.{p}", k, n, (e,)))
            out.update(w4(f"{b}moe.s_{p}", k, n, (1,)))
    return out


FULL = {"hidden": 2304, "kda_heads": 32, "mla_heads": 32, "kv_lora": 512, "n_experts": 64, "moe_inter": 1024,
        "pattern": "KKKM"}
SMALL = {"hidden": 512, "kda_heads": 4, "mla_heads": 4, "kv_lora": 256, "n_experts": 32, "moe_inter": 256,
         "pattern": "KKKM"}


def check_names(model, c, label):
    sd = model.state_dict()
    want = spec_tensors(c)
    check(sorted(sd) == sorted(want), f"{label}: the {len(sd)} state-dict names are exactly the spec's")
    wrong = [k for k, spec in want.items() if k in sd and (sd[k].dtype, tuple(sd[k].shape)) != spec]
    check(not wrong, f"{label}: every tensor has the spec's dtype and shape" + (f" (not {wrong[:3]})" if wrong else ""))


def check_strict_loading(module_cls, cfg, label):
    model = module_cls(cfg)
    sd = model.state_dict()
    g = torch.Generator().manual_seed(1)
    fresh = {k: (torch.randint(0, 256, v.shape, generator=g, dtype=torch.uint8) if v.dtype == torch.uint8
                 else torch.randn(v.shape, generator=g).to(v.dtype)) for k, v in sd.items()}
    model.load_state_dict(fresh, strict=True)
    after = model.state_dict()
    check(all(torch.equal(after[k], fresh[k]) for k in fresh),
          f"{label}: load_state_dict(strict=True) takes a state dict")
    for broken, why in (({k: v for k, v in list(fresh.items())[1:]}, "a missing name"),
                        (dict(fresh, **{"blocks.0.extra": torch.zeros(1)}), "an unexpected name")):
        try:
            model.load_state_dict(broken, strict=True)
            check(False, f"{label}: strict loading refuses {why}")
        except RuntimeError:
            check(True, f"{label}: strict loading refuses {why}")


def check_golden(golden_dir, reference, eager):
    for name in ("kimi-tiny", "kimi-top8"):
        path = pathlib.Path(golden_dir) / f"{name}.safetensors"
        if not path.exists():
            print(f"SKIPPED: {path} not found")
            continue
        t, meta = reference.read_safetensors(path)
        cfg = json.loads(meta["config"])
        weights = {k: v for k, v in t.items() if k.startswith("blocks.")}
        slow = eager.EagerModel(cfg)
        slow.load_state_dict(weights, strict=True)
        worst_ref, worst_eager, experts_differ, steps = 1.0, 1.0, 0, 0
        for ci, case in enumerate(json.loads(meta["cases"])):
            p = f"case{ci}."
            state = [{k: t[f"{p}in.{i}.{k}"] for k in (("S", "cq", "ck", "cv") if kind == "K" else ("c_kv", "k_rope"))}
                     for i, kind in enumerate(cfg["pattern"])]
            x = t[p + "token"]
            for k in range(case["steps"]):
                q = f"{p}step{k}."
                out, new, topk = reference.reference_step(cfg, weights, x, state)
                sims = [reference.similarity(out, t[q + "hidden"])["cosine"]]
                for i, kind in enumerate(cfg["pattern"]):
                    if kind == "K":
                        sims += [reference.similarity(new[i][n], t[f"{q}{i}.{n}"])["cosine"]
                                 for n in ("S", "cq", "ck", "cv")]
                    else:
                        sims += [reference.similarity(new[i]["c_kv"][-1], t[f"{q}{i}.c_kv_row"])["cosine"],
                                 reference.similarity(new[i]["k_rope"][-1], t[f"{q}{i}.k_rope_row"])["cosine"]]
                    experts_differ += topk[i] != t[f"{q}{i}.topk_idx"].tolist()
                worst_ref = min(worst_ref, *sims)
                fed = [{n: v.clone() for n, v in layer.items()} for layer in state]
                got, _ = slow.step(x.clone(), fed)
                worst_eager = min(worst_eager, reference.similarity(got, t[q + "hidden"])["cosine"])
                steps += 1
                # The next step continues from the golden step's outputs.
                state = [{n: t[f"{q}{i}.{n}"] for n in ("S", "cq", "ck", "cv")} if kind == "K" else
                         {"c_kv": torch.cat((state[i]["c_kv"], t[f"{q}{i}.c_kv_row"][None])),
                          "k_rope": torch.cat((state[i]["k_rope"], t[f"{q}{i}.k_rope_row"][None]))}
                         for i, kind in enumerate(cfg["pattern"])]
                x = t[q + "hidden"]
        check(worst_ref >= 0.9999 and experts_differ == 0,
              f"{name}: reference.py reproduces {steps} golden steps (worst cosine {worst_ref:.7f}, "
              f"{experts_differ} expert lists differ)")
        check(worst_eager >= 0.99, f"{name}: eager.py (bf16) follows them (worst hidden cosine {worst_eager:.5f})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("--golden", help="the golden vectors' directory (reference.py and eager.py are checked on them)")
    args = ap.parse_args()
    sys.path.insert(0, str(pathlib.Path(args.export_dir).resolve()))
    import solution
    import reference
    import eager

    record = json.loads((pathlib.Path(args.export_dir) / "variant.json").read_text())
    check(solution.VARIANT_ID == record["variant"] and solution.CONFIG == record["config"],
          "solution.py carries the variant's id and config")

    model = solution.Model()  # the exported config, on the CPU
    exported = {**FULL, **{k: record["config"][k] for k in FULL}}
    check_names(model, exported, "Model() [exported config]")
    specs = {w["name"]: (w["dtype"], tuple(w["shape"])) for w in record["weights"]}
    dtypes = {torch.uint8: "U8", torch.bfloat16: "BF16"}
    mine = {k: (dtypes.get(v.dtype, str(v.dtype)), tuple(v.shape)) for k, v in model.state_dict().items()}
    check(mine == specs, "Model() matches ktune's weight specs (variant.json): names, dtypes, shapes")
    model.load_state_dict(model.state_dict(), strict=True)
    check(True, "Model() loads its own state dict with strict=True")
    check_names(solution.Model({}, device="meta"), FULL, "Model({}) [the spec's sizes]")
    check_names(solution.Model(SMALL), SMALL, "Model(small)")
    check_strict_loading(solution.Model, SMALL, "Model(small)")
    check_strict_loading(eager.EagerModel, SMALL, "EagerModel(small)")

    state = model.zero_state()
    check([sorted(layer) for layer in state] == [["S", "ck", "cq", "cv"]] * 3 + [["c_kv", "k_rope"]] and
          tuple(state[0]["S"].shape) == (32, 128, 128) and tuple(state[3]["c_kv"].shape) == (0, 512),
          "zero_state(): the spec's state layout")
    try:
        solution.Model(SMALL).step(torch.zeros(512, dtype=torch.bfloat16), solution.Model(SMALL).zero_state())
        check(False, "step() on a config the kernel was not built for is refused")
    except ValueError as e:
        check("other sizes" in str(e), f"step() on a config the kernel was not built for is refused ({e})"[:160])
    try:
        model.step(torch.zeros(2304, dtype=torch.bfloat16), state)
        check(False, "step() on the CPU is refused")
    except RuntimeError as e:
        check("CUDA" in str(e), f"step() on the CPU is refused before building anything ({e})")
    check(solution._EXTENSION is None, "no CUDA extension was built or loaded")

    # The helpers the GPU check uses when ktune's weight file is absent.
    small = solution.Model(SMALL, device="meta").state_dict()
    weights = reference.random_weights(small, seed=0, device="cpu")
    solution.Model(SMALL).load_state_dict(weights, strict=True)
    w = reference.dequantize(weights["blocks.0.attn.q_proj.w_q"], weights["blocks.0.attn.q_proj.scales"],
                             weights["blocks.0.attn.q_proj.zeros"], torch.float64)
    check(0.015 < float(w.std()) < 0.025, f"random_weights: the spec's recipe (dequantized std {float(w.std()):.4f})")
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "w.safetensors"
        reference.write_safetensors(path, weights, {"config": json.dumps(SMALL)})
        back, meta = reference.read_safetensors(path)
        check(json.loads(meta["config"]) == SMALL and sorted(back) == sorted(weights) and
              all(torch.equal(back[k], weights[k]) for k in weights), "safetensors written and read back")
    small_cfg = solution.full_config(SMALL)
    out, new, _ = reference.reference_step(small_cfg, weights, reference.make_token(small_cfg, 0),
                                           reference.make_state(small_cfg, 0, 7))
    check(tuple(new[3]["c_kv"].shape) == (8, 256) and bool(torch.isfinite(out.float()).all()),
          "reference_step on a seeded state: finite output, the cache one row longer")

    if args.golden:
        check_golden(args.golden, reference, eager)
    print(f"{len(FAILURES)} failed" if FAILURES else "all passed")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()

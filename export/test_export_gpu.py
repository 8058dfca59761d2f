# test_export_gpu.py: the GPU check of an exported module, in this (fresh)
# Python process: it imports solution.py from the export directory, builds
# its CUDA code, loads the weights from a safetensors file with strict=True,
# and shows
#   1. accuracy against reference.py (float64) on seeds 0-2 at contexts 2048
#      and 8192: cosine >= 0.999 on the output, every KDA layer's S and the
#      appended MLA cache row, the same expert sets; both for fresh states
#      fed after earlier steps and for steps continuing the module's own state;
#   2. torch.profiler over one steady-state step(): exactly one kernel (and,
#      for information, a step fed a fresh state: still one kernel, the cache
#      copied by memcpy);
#   3. time per step of the module and of eager.py at contexts 2048, 8192 and
#      16384, in this one run (CUDA events, warm-up, medians).
# It prints a table and, when $OUT is set, writes $OUT/export_gpu.json and
# the profiler's trace. Exit status 1 when a check fails.
# Usage: python3 export/test_export_gpu.py EXPORT_DIR [--weights FILE.safetensors]
# Weights: ktune's cached generated weights (kimi-full-w0.safetensors in
# ktune's cache dir) by default; when absent, weights drawn here by the
# spec's recipe (reference.random_weights), written to a temporary file and
# loaded from it.
import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

FAILURES = []
MIN_COSINE = 0.999


def check(ok, what):
    print(("ok:   " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def ktune_cache_dir():
    """As ktune's cache_dir(): $KTUNE_CACHE_DIR, $XDG_CACHE_HOME/ktune, ~/.cache/ktune."""
    if os.environ.get("KTUNE_CACHE_DIR"):
        return pathlib.Path(os.environ["KTUNE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return pathlib.Path(base) / "ktune"


def weights_file(args, solution, reference, tmp):
    if args.weights:
        return pathlib.Path(args.weights), "given"
    cached = ktune_cache_dir() / f"kimi-{solution.CONFIG['name']}-w0.safetensors"
    if cached.exists():
        return cached, "ktune's cached weights"
    like = solution.Model(solution.CONFIG, device="meta").state_dict()
    path = pathlib.Path(tmp) / "weights.safetensors"
    reference.write_safetensors(path, reference.random_weights(like, seed=0, device="cuda"),
                                {"config": json.dumps(solution.CONFIG)})
    return path, f"drawn by reference.random_weights ({cached} absent)"


def clone_state(state):
    return [{k: v.clone() for k, v in layer.items()} for layer in state]


def compare_step(tag, model, reference, cfg, x, fed, out, new, ref):
    """One module step (out, new) from (x, fed) against the reference's answer."""
    ref_out, ref_state, ref_topk = ref
    rows = fed[3]["c_kv"].shape[0]
    m = {"hidden": reference.similarity(out, ref_out)}
    for i, kind in enumerate(cfg["pattern"]):
        if kind == "K":
            m[f"L{i}.S"] = reference.similarity(new[i]["S"], ref_state[i]["S"])
            m[f"L{i}.S_change"] = reference.similarity(new[i]["S"] - fed[i]["S"], ref_state[i]["S"] - fed[i]["S"])
            for w in ("cq", "ck", "cv"):
                m[f"L{i}.{w}"] = reference.similarity(new[i][w], ref_state[i][w])
        else:
            m[f"L{i}.c_kv_row"] = reference.similarity(new[i]["c_kv"][rows], ref_state[i]["c_kv"][rows])
            m[f"L{i}.k_rope_row"] = reference.similarity(new[i]["k_rope"][rows], ref_state[i]["k_rope"][rows])
    topk = model.last_topk().tolist()
    same_sets = all(sorted(a) == sorted(b) for a, b in zip(topk, ref_topk))
    same_order = topk == [list(t) for t in ref_topk]
    kept = bool(torch.equal(new[3]["c_kv"][:rows], fed[3]["c_kv"]) and torch.equal(new[3]["k_rope"][:rows],
                                                                                      fed[3]["k_rope"]))
    gated = {k: v for k, v in m.items() if not k.endswith("S_change")}
    worst = min(v["cosine"] for v in gated.values())
    finite = all(v["nonfinite"] == 0 for v in m.values())
    check(worst >= MIN_COSINE and finite and same_sets and kept and new[3]["c_kv"].shape[0] == rows + 1,
          f"{tag}: worst cosine {worst:.6f} (hidden {m['hidden']['cosine']:.6f}, "
          f"S change {min(v['cosine'] for k, v in m.items() if k.endswith('S_change')):.6f}), "
          f"experts {'same order' if same_order else 'same sets' if same_sets else 'DIFFER'}, "
          f"cache {rows} -> {new[3]['c_kv'].shape[0]} rows, old rows kept: {kept}")
    return {"case": tag, "context": rows, "worst_cosine": worst, "metrics": m, "same_expert_sets": same_sets,
            "same_expert_order": same_order, "old_rows_kept": kept}


def accuracy(model, reference, cfg, dev):
    cases = []
    for context in (2048, 8192):
        for seed in (0, 1, 2):
            state, x = reference.make_state(cfg, seed, context, dev), reference.make_token(cfg, seed, dev)
            ref = reference.reference_step(cfg, model.state_dict(), x, state)
            fed = clone_state(state)  # the module updates the K layers' tensors in place
            out, new = model.step(x, fed)
            tag = f"seed {seed} L={context} fresh state" + (" after earlier steps" if cases else "")
            cases.append(compare_step(tag, model, reference, cfg, x, state, out, new, ref))
            # The next step continues from what the module returned (no copy).
            fed, x = clone_state(new), out
            ref = reference.reference_step(cfg, model.state_dict(), x, fed)
            out, new = model.step(x, new)
            cases.append(compare_step(f"seed {seed} L={context + 1} continuing the module's state", model, reference,
                                      cfg, x, fed, out, new, ref))
    return cases


def kernels_in(fn, trace_path):
    """Runs fn() under torch.profiler; the GPU activities of the chrome trace by category."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))
    by = {}
    for e in json.loads(pathlib.Path(trace_path).read_text())["traceEvents"]:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset"):
            by.setdefault(e["cat"].lower(), []).append(e["name"])
    return by


def profile_steps(model, reference, cfg, dev, out_dir):
    state, x = reference.make_state(cfg, 0, 2048, dev), reference.make_token(cfg, 0, dev)
    for _ in range(5):
        x, state = model.step(x, state)
    result = {}
    box = {"x": x, "state": state}

    def steady():
        box["x"], box["state"] = model.step(box["x"], box["state"])

    by = kernels_in(steady, out_dir / "export_step_trace.json")
    result["steady_state"] = by
    kernels = by.get("kernel", [])
    check(len(kernels) == 1 and "ktune_k0" in kernels[0],
          f"torch.profiler over one steady-state step(): {len(kernels)} kernel(s) {kernels}, "
          f"{len(by.get('gpu_memcpy', []))} memcpy, {len(by.get('gpu_memset', []))} memset")
    fresh = reference.make_state(cfg, 1, 8192 + 7, dev)

    def fresh_step():
        model.step(box["x"], fresh)

    by = kernels_in(fresh_step, out_dir / "export_fresh_step_trace.json")
    result["fresh_state"] = by
    print(f"info: a step fed a fresh, longer state: {len(by.get('kernel', []))} kernel(s) {by.get('kernel', [])}, "
          f"memcpy {by.get('gpu_memcpy', [])}", flush=True)
    return result


def time_steps(step, x, state, warmup, samples):
    """Per-step times (us): each step alone between CUDA events after a sync
    (what a decode loop that reads every token sees), and the mean of the
    same number of steps back to back (the device time per step)."""
    for _ in range(warmup):
        x, state = step(x, state)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    alone = []
    for _ in range(samples):
        torch.cuda.synchronize()
        e0.record()
        x, state = step(x, state)
        e1.record()
        e1.synchronize()
        alone.append(e0.elapsed_time(e1) * 1000)
    torch.cuda.synchronize()
    e0.record()
    for _ in range(samples):
        x, state = step(x, state)
    e1.record()
    e1.synchronize()
    alone.sort()
    return {"median_us": statistics.median(alone), "p10_us": alone[len(alone) // 10],
            "p90_us": alone[(9 * len(alone)) // 10], "back_to_back_us": e0.elapsed_time(e1) * 1000 / samples,
            "samples": samples, "warmup": warmup, "samples_us": alone}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("--weights", help="a safetensors file of the weights (spec names; a `config` in its metadata)")
    args = ap.parse_args()
    export_dir = pathlib.Path(args.export_dir).resolve()
    out_dir = pathlib.Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="ktune-export-gpu-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(export_dir))
    import eager
    import reference
    import solution

    dev = torch.device("cuda")
    results = {"variant": solution.VARIANT_ID, "knobs": solution.KNOBS, "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "cuda": torch.version.cuda}
    print(f"variant {solution.VARIANT_ID[:16]} {solution.KNOBS}\n{results['device']}, torch {torch.__version__}",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path, origin = weights_file(args, solution, reference, tmp)
        t0 = time.time()
        tensors, meta = reference.read_safetensors(path)
        cfg = solution.full_config(json.loads(meta["config"]))
        model = solution.Model(cfg, device=dev)
        model.load_state_dict(tensors, strict=True)
        del tensors
        results["weights"] = {"file": str(path), "origin": origin, "load_s": time.time() - t0}
        check(True, f"weights from {path} ({origin}) loaded with strict=True in {time.time() - t0:.1f} s")

    t0 = time.time()
    model.prepare()
    results["build_s"] = time.time() - t0
    launch = results["launch"] = model.launch_info()
    print(f"info: built and bound in {results['build_s']:.1f} s; one launch of {launch['grid']} x {launch['block']} "
          f"threads, {launch['smem']} B shared memory, {launch['scratch_bytes']} B scratch", flush=True)

    results["accuracy"] = accuracy(model, reference, cfg, dev)
    results["profile"] = profile_steps(model, reference, cfg, dev, out_dir)

    slow = eager.EagerModel(cfg, device=dev)
    slow.load_state_dict(model.state_dict(), strict=True)
    state, x = reference.make_state(cfg, 0, 2048, dev), reference.make_token(cfg, 0, dev)
    ref_out = reference.reference_step(cfg, model.state_dict(), x, state)[0]
    eager_cos = reference.similarity(slow.step(x, clone_state(state))[0], ref_out)["cosine"]
    results["eager_hidden_cosine"] = eager_cos
    print(f"info: eager.py against the reference (seed 0, L=2048): hidden cosine {eager_cos:.6f}", flush=True)

    timing = []
    for context in (2048, 8192, 16384):
        row = {"context": context}
        for name, step, warmup, samples in (("module", model.step, 10, 50), ("eager", slow.step, 3, 30)):
            state = reference.make_state(cfg, 0, context, dev)
            row[name] = time_steps(step, reference.make_token(cfg, 0, dev), state, warmup, samples)
        row["speedup"] = row["eager"]["median_us"] / row["module"]["median_us"]
        row["speedup_back_to_back"] = row["eager"]["back_to_back_us"] / row["module"]["back_to_back_us"]
        timing.append(row)
    results["timing"] = timing
    print("\nus per step (median of steps timed alone; back-to-back mean in brackets), same run:")
    print(f"{'context':>8} | {'exported module':>22} | {'PyTorch eager':>22} | speedup")
    for r in timing:
        m, e = r["module"], r["eager"]
        print(f"{r['context']:>8} | {m['median_us']:>9.1f} [{m['back_to_back_us']:>9.1f}] | "
              f"{e['median_us']:>9.1f} [{e['back_to_back_us']:>9.1f}] | {r['speedup']:.1f}x "
              f"[{r['speedup_back_to_back']:.1f}x]")

    results["failures"] = FAILURES
    (out_dir / "export_gpu.json").write_text(json.dumps(results, indent=1))
    print(f"\n{len(FAILURES)} check(s) failed" if FAILURES else "\nall checks passed", f"(results: {out_dir})")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()

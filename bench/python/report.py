"""What the bench prints: the versions and machine line, the one table, the checks."""
import importlib.metadata
import os
import platform

import torch

TASK_TITLES = {
    "forward": "forward, no hooks",
    "capture12": "capture 12 block outputs",
    "capture_all": "capture every module",
    "edit12": "edit 12 blocks (+vector)",
    "generate": "steered greedy generate",
}


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def versions():
    import transformers
    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    for dist in ("nnsight", "transformer-lens", "accelerate", "flex-model"):
        out[dist] = _version(dist)
    try:
        import flexmodel
        out["flexmodel"] = flexmodel.__version__
    except Exception as e:  # noqa: BLE001 - reported, not fatal: the other tools still run
        out["flexmodel"] = f"import failed: {type(e).__name__}: {e}"
    return out


def machine(threads):
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": threads}


def header(v, m):
    tools = ", ".join(f"{k} {val}" for k, val in v.items())
    return f"{tools}\nmachine: {m['cpu']}, {m['cores']} cores; torch.set_num_threads({m['torch_threads']}) for every tool"


def _ms(x):
    return "" if x is None else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def table(rows):
    """Markdown: one line per (model, input, task, tool variant)."""
    lines = ["| model | input | task | tool | modules | ms (median) | x Transformers | check |",
             "|---|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        ratio = "" if r.get("ratio") is None else f"{r['ratio']:.2f}"
        what = r["error"] if r.get("error") else r.get("check", "")
        lines.append(f"| {r['model']} | {r['input']} | {TASK_TITLES[r['task']]} | {r['label']} | "
                     f"{r.get('modules') or ''} | {_ms(r.get('ms'))} | {ratio} | {what.replace('|', '/')} |")
    return "\n".join(lines)


def one_line(e, limit=160):
    """An exception as one short line for a table cell."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[:limit - 3] + "..."

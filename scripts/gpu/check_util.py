#!/usr/bin/env python3
"""Helpers of scripts/gpu/check.sh (torch and the standard library only; safetensors read by hand).

  check_util.py ids MODEL_DIR OUT.safetensors      input_ids [2, 24] below the model's vocabulary
  check_util.py map INSPECT.json OUT.json [--gpu 0] a device map with GPU 0, cpu and disk entries
  check_util.py compare A.safetensors B.safetensors --label NAME [--jsonl FILE]
                                                   largest |a - b| over the tensors both hold
  check_util.py labels CTEST_JSON CTEST_LOG... --out FILE.md   tests passed/failed/skipped per label
  check_util.py table JSONL                        the comparisons as a Markdown table
"""
import argparse
import json
import re
import struct
import sys

DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
          "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def read_safetensors(path):
    """{name: tensor} of a .safetensors file."""
    import torch
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = getattr(torch, DTYPES[info["dtype"]])
        raw = bytearray(blob[base + begin:base + end])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def vocab_size(model_dir):
    cfg = json.load(open(f"{model_dir}/config.json"))
    for c in (cfg, cfg.get("text_config") or {}):
        if c.get("vocab_size"):
            return int(c["vocab_size"])
    return 50


def cmd_ids(a):
    v = vocab_size(a.model_dir)
    ids = [(i * 7919 + 3) % v for i in range(2 * 24)]
    write_safetensors(a.out, {"input_ids": ("I64", [2, 24], struct.pack("<48q", *ids))})


BLOCK = re.compile(r"^(?:.+\.)?(?:layers|h)\.(\d+)$")


def cmd_map(a):
    """From `flexmodel inspect MODEL --json`'s module names: block i on (cpu, disk, 0)[i % 3], every other
    module on GPU 0; entries are the largest subtrees without a block inside (hook points left out)."""
    inspect = json.load(open(a.inspect))
    sizes = inspect["module_sizes"]
    names = [n for n in sizes if n and not n.split(".")[-1].startswith("hook_")]
    blocks = [n for n in names if BLOCK.match(n)]
    gpu = int(a.gpu) if a.gpu.isdigit() else a.gpu
    kinds = ["cpu", "disk", gpu]
    plan = {}

    def children(prefix):
        depth = prefix.count(".") + 1 if prefix else 0
        return [n for n in names if n.count(".") == depth and (not prefix or n.startswith(prefix + "."))]

    def walk(prefix):
        for c in children(prefix):
            if c in blocks:
                plan[c] = kinds[blocks.index(c) % 3]
            elif any(b.startswith(c + ".") for b in blocks):
                walk(c)
            else:  # tensors or none (a tied head sized 0, a dropout): on the GPU
                plan[c] = gpu
    walk("")
    # A tied head is left out of the sizes (its bytes are its partner's): mapped beside it, on the GPU.
    for group in inspect.get("tied_parameters", []):
        for param in group:
            module = param.rsplit(".", 1)[0]
            if not any(module == k or module.startswith(k + ".") for k in plan):
                plan[module] = gpu
    json.dump(plan, open(a.out, "w"), indent=1)
    counts = {k: sum(1 for v in plan.values() if v == k) for k in (gpu, "cpu", "disk")}
    print(f"map: {counts[gpu]} entries on {gpu}, {counts['cpu']} on cpu, {counts['disk']} on disk")


def cmd_compare(a):
    import torch
    try:
        x, y = read_safetensors(a.a), read_safetensors(a.b)
    except (OSError, ValueError, KeyError) as e:
        print(f"{a.label}: cannot read: {e}")
        return 2
    common = [k for k in x if k in y and x[k].is_floating_point() and y[k].is_floating_point()]
    only = sorted(set(x) ^ set(y))
    worst, at, scale, bad_shape = 0.0, "-", 0.0, []
    for k in common:
        if x[k].shape != y[k].shape:
            bad_shape.append(k)
            continue
        if not x[k].numel():
            continue
        d = float((x[k].double() - y[k].double()).abs().max())
        scale = max(scale, float(x[k].double().abs().max()))
        if at == "-" or d > worst:
            worst, at = d, k
    ok = bool(common) and not only and not bad_shape and worst <= a.tol * max(1.0, scale)
    row = {"label": a.label, "tensors_a": len(x), "tensors_b": len(y), "compared": len(common), "max_abs": worst,
           "at": at, "scale": scale, "only_one_side": only[:5], "shape_differs": bad_shape[:5], "ok": ok}
    print(f"{a.label}: {len(common)} tensors compared ({len(x)} vs {len(y)}); max |a - b| {worst:.3g} at {at} "
          f"(largest |a| {scale:.3g}){'' if not only else f'; only one side: {only[:5]}'}"
          f"{'' if not bad_shape else f'; shapes differ: {bad_shape[:5]}'} -> {'ok' if ok else 'DIFFERS'}")
    if a.jsonl:
        with open(a.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0 if ok else 1


# "  3/41 Test  #3: name ......   Passed    0.85 sec", "***Failed", "***Skipped", "***Exception: SegFault",
# "***Timeout", "***Not Run" (no executable: a failure, as ctest counts it).
RESULT = re.compile(r"Test\s+#\d+:\s+(\S+)\s+\.+\s*(?:\*\*\*)?([A-Za-z]+)")


def cmd_labels(a):
    """Per label: passed / failed / skipped from ctest's console output, labels from `ctest --show-only=json-v1`."""
    labels = {}
    try:
        for t in json.load(open(a.ctest_json)).get("tests", []):
            for p in t.get("properties", []):
                if p.get("name") == "LABELS":
                    labels[t["name"]] = p.get("value") or []
    except (OSError, ValueError):
        pass
    status = {}
    for log in a.logs:
        try:
            text = open(log, errors="replace").read()
        except OSError:
            continue
        for m in RESULT.finditer(text):
            s = m.group(2)
            status[m.group(1)] = "passed" if s == "Passed" else "skipped" if s in ("Skipped", "Disabled") else "failed"
    rows = {}
    for name, s in status.items():
        for lab in labels.get(name) or ["(none)"]:
            rows.setdefault(lab, {"passed": [], "failed": [], "skipped": []})[s].append(name)
    lines = ["| label | passed | failed | skipped | failed tests |", "|---|---|---|---|---|"]
    for lab in sorted(rows):
        r = rows[lab]
        lines.append(f"| {lab} | {len(r['passed'])} | {len(r['failed'])} | {len(r['skipped'])} | "
                     f"{', '.join(sorted(r['failed'])[:8]) + (' ...' if len(r['failed']) > 8 else '')} |")
    total = {k: sum(1 for s in status.values() if s == k) for k in ("passed", "failed", "skipped")}
    lines.append(f"\n{len(status)} tests: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    open(a.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


def cmd_table(a):
    rows = []
    try:
        rows = [json.loads(line) for line in open(a.jsonl) if line.strip()]
    except OSError:
        pass
    print("| comparison | tensors | max abs difference | where | largest magnitude | result |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['label']} | {r['compared']} | {r['max_abs']:.3g} | {r['at']} | {r['scale']:.3g} | "
              f"{'ok' if r['ok'] else 'DIFFERS'} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("ids")
    s.add_argument("model_dir")
    s.add_argument("out")
    s = sub.add_parser("map")
    s.add_argument("inspect")
    s.add_argument("out")
    s.add_argument("--gpu", default="0", help="the GPU entry (cpu: a dry run without a GPU)")
    s = sub.add_parser("compare")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("--label", default="compare")
    s.add_argument("--jsonl")
    s.add_argument("--tol", type=float, default=1e-4, help="ok when max |a - b| <= tol * max(1, largest |a|)")
    s = sub.add_parser("labels")
    s.add_argument("ctest_json")
    s.add_argument("logs", nargs="+")
    s.add_argument("--out", required=True)
    s = sub.add_parser("table")
    s.add_argument("jsonl")
    a = p.parse_args()
    return {"ids": cmd_ids, "map": cmd_map, "compare": cmd_compare, "labels": cmd_labels, "table": cmd_table}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())

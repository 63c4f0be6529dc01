"""The demo's ``--quick`` run end to end, an earlier revision and this one in turn, on the same machine.

    python benchmarks/quick_demo_speed.py --old 2c3be32 --runs /tmp/quick-speed

The earlier revision is checked out as a git worktree and run with this environment's packages
(``PYTHONPATH`` puts its ``searchr1`` first); both runs are ``searchr1 demo --quick`` with that revision's
own recipe, model preparation done beforehand (the converted model is cached). Writes the wall time of
each, their ratio and the load average before each run to ``benchmarks/results/quick_demo_speed.json``.
Run it with nothing else on the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from searchr1.demo.hotpotqa_report import machine
from searchr1.precision import cpu_has_fast_bf16

ROOT = Path(__file__).resolve().parents[1]


def run_quick(source: Path, out: Path) -> dict[str, float | str]:
    env = dict(os.environ, PYTHONPATH=str(source), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "searchr1.cli", "demo", "--quick", "--out", str(out)],
        cwd=source,
        env=env,
        check=True,
    )
    seconds = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    seed = next(iter(summary["seeds"].values()))
    phases = [json.loads(p.read_text()).get("phase_seconds") for p in sorted(out.rglob("row.json"))]
    return {
        "seconds": seconds,
        "load_average_before": load,
        "em_before": seed["em_before"],
        "em_after": seed["em_after"],
        **({"phase_seconds": phases[0]} if phases and phases[0] else {}),  # revisions that record them
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", required=True, help="the earlier revision (a git commit)")
    parser.add_argument(
        "--runs", type=Path, required=True, help="a scratch folder for the worktree and the runs"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "quick_demo_speed.json")
    args = parser.parse_args()
    args.runs.mkdir(parents=True, exist_ok=True)
    tree = args.runs / f"tree-{args.old}"
    if not tree.exists():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), args.old], check=True
        )
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    old = run_quick(tree, args.runs / "old")
    result: dict[str, object] = {"old": {"revision": args.old, **old}, "machine": {**machine("cpu"), "bfloat16_units": cpu_has_fast_bf16()}}
    args.out.write_text(json.dumps(result, indent=1) + "\n")  # the first run kept if the second is cut short
    new = run_quick(ROOT, args.runs / "new")
    result.update(
        new={"revision": head.stdout.strip(), **new},
        speedup=float(old["seconds"]) / float(new["seconds"]),
        ratio=float(new["seconds"]) / float(old["seconds"]),
        created=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"--quick: {old['seconds']:.0f} s ({args.old}) -> {new['seconds']:.0f} s: {result['speedup']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

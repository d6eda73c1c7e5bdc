"""How fast the demo agent learns: `rlproxy demo` run headless for a fixed time, once per variant, each from
a fresh store, all in one invocation so the numbers compare.

For each variant it prints the base model's held-out success (a full held-out evaluation before training),
the best and the final held-out success (a rolling window over the held-out probes: held-out tasks run
among the agent's episodes, never trained on), the minutes until the window first stood 25 points above
base, training rollouts per minute, and the number of adapter versions.

    .venv/bin/python bench/learning.py                      # every variant below, 15 min each
    .venv/bin/python bench/learning.py --minutes 5 --variants default
    .venv/bin/python bench/learning.py --engine-url http://127.0.0.1:8000   # reuse a running engine

Variants differ from the demo's defaults only by the flags listed in VARIANTS.

With `--family NAME[,NAME…]` (or `--family all`) it runs task families that are not the demo (bench/families/)
instead: `rlproxy engine`, `rlproxy serve` and `rlproxy train` with default settings, a plain `openai`-SDK agent
(bench/family_learning.py), and prints per family the base and final held-out success with 95% intervals, the
minutes until held-out success first stood 25 points above base, and the peak memory of every process.

    .venv/bin/python bench/learning.py --family all --minutes 15
    .venv/bin/python bench/learning.py --family tools --set kl_coef=0.05   # one setting changed
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.view import rolling  # noqa: E402
from testkit.processes import free_port  # noqa: E402

VARIANTS: dict[str, list[str]] = {
    "default": [],  # credit identical, AIR on
    "no-air": ["--no-air"],
    "discounted": ["--set", "credit=discounted", "--set", "gamma=0.9"],
    # what exact capture buys: train on the recorded text re-tokenized, behaviour log-probs recomputed
    "retokenized": ["--set", "token_source=retokenized"],
}
TARGET_POINTS = 25


def summarize(state: dict, window: int) -> dict:
    """The printed row, from the demo's state file (`rlproxy-demo.json`)."""
    run = state["last_run"]
    base = state["heldout"].get("0")
    probes = run["probes"]  # [seconds, reward, policy version]
    # judge the window only once it is full (or at the end of a short run)
    curve = rolling([r for _, r, _ in probes], window, warmup=min(window, len(probes)))
    judged = [(t, v) for (t, _, _), v in zip(probes, curve) if not math.isnan(v)]
    to_target = next((t / 60 for t, v in judged if base is not None and v >= base + TARGET_POINTS / 100), None)
    training = run["rewards"]
    return {
        "base": base,
        "best": max((v for _, v in judged), default=None),
        "final": judged[-1][1] if judged else None,
        "minutes_to_target": to_target,
        "rollouts_per_min": len(training) / run["minutes"] if run["minutes"] else 0.0,
        "train_reward_first": statistics.fmean(r for _, r, _ in training[:window]) if training else None,
        "train_reward_last": statistics.fmean(r for _, r, _ in training[-window:]) if training else None,
        "probes": len(probes),
        "versions": run["versions"],
        "minutes": run["minutes"],
    }


def run_variant(name: str, flags: list[str], minutes: float, out: Path, engine_url: str | None) -> dict:
    workdir = out / name
    workdir.mkdir(parents=True, exist_ok=False)
    command = [sys.executable, "-m", "rlproxy.cli", "demo", "--headless", "--minutes", str(minutes),
               "--workdir", str(workdir), "--database-url", f"sqlite+aiosqlite:///{workdir / 'rlproxy.db'}",
               "--port", str(free_port()), "--engine-port", str(free_port()), *flags]
    if engine_url:
        command += ["--upstream", engine_url]
    began = time.monotonic()
    with open(workdir / "demo.log", "w") as log:
        subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=True, cwd=workdir)
    print(f"  {name}: {(time.monotonic() - began) / 60:.1f} min wall, log {workdir / 'demo.log'}", flush=True)
    return json.loads((workdir / "rlproxy-demo.json").read_text())


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def run_families(args: argparse.Namespace) -> None:
    from bench.families import FAMILIES
    from bench.family_learning import run_family

    names = list(FAMILIES) if args.family == "all" else args.family.split(",")
    rows = []
    for name in names:
        began = time.monotonic()
        rows.append(run_family(FAMILIES[name], args.minutes, args.out, args.postgres, engine_url=args.engine_url,
                               train_settings=args.set))
        print(f"  {name}: {(time.monotonic() - began) / 60:.1f} min wall, logs in {args.out / name}", flush=True)
    print(f"\nheld-out success with default settings, {args.minutes:g} training minutes, target +{TARGET_POINTS} "
          f"points; 95% intervals")
    print(" | ".join(("family", "base", "final", "best", "final-base", f"min to +{TARGET_POINTS}", "rollouts",
                      "final version", "peak GB: engine/proxy/trainer/agent = sum")))
    for row in rows:
        peak = row["peak_gb"]
        print(" | ".join([
            row["family"], _with_interval(row["base"], row["base_interval"]),
            _with_interval(row["final"], row["final_interval"]), percent(row["best"]),
            f"{(row['final'] - row['base']) * 100:+.0f} pts",
            "not reached" if row["minutes_to_target"] is None else f"{row['minutes_to_target']:.1f}",
            str(row["training_rollouts"]), f"v{row['final_version']}",
            f"{peak['engine']:.2f}/{peak['proxy']:.2f}/{peak['trainer']:.2f}/{peak['agent']:.2f} = {peak['sum']:.2f}",
        ]))


def _with_interval(value: float, interval: tuple[float, float]) -> str:
    return f"{value:.0%} [{interval[0]:.0%}, {interval[1]:.0%}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=15.0, help="training minutes per variant")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}")
    parser.add_argument("--window", type=int, default=32, help="held-out probes per rolling window")
    parser.add_argument("--out", type=Path, default=Path(f"/tmp/rlproxy-learning-{int(time.time())}"))
    parser.add_argument("--engine-url", default=None, help="a running engine (runtime LoRA on) to share")
    parser.add_argument("--from-state", type=Path, nargs="*", default=None,
                        help="only summarize these rlproxy-demo.json files (no runs)")
    parser.add_argument("--family", default=None,
                        help="run these task families (comma-separated, or 'all') instead of demo variants")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="with --family: a training setting that differs from the default (repeatable), "
                             "passed to `rlproxy train --set`; without it every setting is the default")
    parser.add_argument("--postgres", default=os.environ.get("RLPROXY_TEST_POSTGRES",
                                                             "postgresql://postgres@127.0.0.1:5432/test"),
                        help="with --family: a Postgres server (libpq URL) to create each run's database on")
    args = parser.parse_args()

    if args.family:
        run_families(args)
        return
    if args.from_state:
        states = {path.parent.name: json.loads(path.read_text()) for path in args.from_state}
    else:
        states = {}
        for name in args.variants.split(","):
            states[name] = run_variant(name, VARIANTS[name], args.minutes, args.out, args.engine_url)

    print(f"\nheld-out success (rolling {args.window} probes), target +{TARGET_POINTS} points")
    header = ("variant", "base", "best", "final", "best-base", f"min to +{TARGET_POINTS}", "rollouts/min",
              "train r first", "train r last", "probes", "versions")
    print(" | ".join(header))
    for name, state in states.items():
        row = summarize(state, args.window)
        gain = None if row["best"] is None or row["base"] is None else row["best"] - row["base"]
        print(" | ".join([
            name, percent(row["base"]), percent(row["best"]), percent(row["final"]),
            "-" if gain is None else f"{gain * 100:+.0f} pts",
            "not reached" if row["minutes_to_target"] is None else f"{row['minutes_to_target']:.1f}",
            f"{row['rollouts_per_min']:.1f}", percent(row["train_reward_first"]), percent(row["train_reward_last"]),
            str(row["probes"]), str(row["versions"]),
        ]))


if __name__ == "__main__":
    main()

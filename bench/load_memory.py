"""Peak host memory per rank while the trainer loads its model: one process, and 2 and 4 ranks under torchrun (gloo).

    .venv/bin/python bench/load_memory.py                       # the bundled model; 1, 2 and 4 ranks
    .venv/bin/python bench/load_memory.py --ranks 1,2 --model DIR --out bench/results/load_memory.txt

Each configuration runs in fresh processes. Every rank reads its resident memory (VmRSS) once torch, transformers,
peft and OpenRLHF are imported and its process group is up (the fixed part: what any rank costs before a weight is
read), then builds `PolicyTrainer` and reads its peak (VmHWM, the kernel's own record: a spike between two reads
still counts). The model part is the peak less the fixed part. With several ranks the base is sharded by FSDP2 and
each rank reads only its own rows of the checkpoint (trainer/loading.py, plain reads: the page cache they fill is not
the process's), so the model part falls with the ranks. One process loads through transformers, whose memory map of
the checkpoint counts in its RSS while it loads (on a CPU without fast bfloat16 the trainer also copies the float32
weights back over the bf16 ones it loaded: trainer/ppo.py).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULT = "RESULT "
MB = 2**20


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def load(model: str) -> None:
    """(one rank, or the one process) Load the trainer and print what it cost."""
    import torch

    from core.settings import TrainingSettings
    from trainer import parallel
    from trainer.compat import import_openrlhf
    from trainer.ppo import PolicyTrainer

    import_openrlhf()
    collective = parallel.init_from_environment() if parallel.launched_by_torchrun() else None
    fixed = _status_kb("VmRSS")
    started = time.perf_counter()
    policy = PolicyTrainer(model, TrainingSettings(), collective=collective)
    seconds = time.perf_counter() - started
    peak, now = _status_kb("VmHWM"), _status_kb("VmRSS")
    dtype = str(next(p for n, p in policy.model.named_parameters() if "lora_" not in n).dtype)
    print(RESULT + json.dumps({"rank": collective.rank if collective else 0, "fixed_kb": fixed, "peak_kb": peak,
                               "after_kb": now, "seconds": seconds, "dtype": dtype}), flush=True)
    if collective:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def run(model: str, ranks: int) -> list[dict]:
    launcher = ([sys.executable] if ranks == 1 else
                [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([*launcher, __file__, "load", "--model", model], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    rows = [json.loads(line[len(RESULT):]) for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or len(rows) != ranks:
        raise RuntimeError(f"{ranks} rank(s): exit {done.returncode}: {done.stderr[-2000:]}")
    return sorted(rows, key=lambda row: row["rank"])


def bundled_model() -> str:
    from core.settings.locations import cache_dir

    return str(cache_dir() / "models" / "SmolLM2-135M-Instruct")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", choices=["load"], help="(internal) one rank's load")
    parser.add_argument("--model", default=None, help="a Hugging Face folder (default: the bundled model)")
    parser.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    parser.add_argument("--out", type=Path, help="also append the report here")
    args = parser.parse_args()
    model = args.model or bundled_model()
    if args.mode == "load":
        return load(model)
    size = sum(f.stat().st_size for f in Path(model).glob("*.safetensors"))
    lines = [f"## {time.strftime('%Y-%m-%d')} python bench/load_memory.py --ranks {','.join(map(str, args.ranks))}",
             f"model {Path(model).name}: {size / MB:.0f} MiB of safetensors; the trainer's default settings; "
             f"CPU, gloo; MiB per rank",
             f"{'ranks':>5} {'rank':>4} {'fixed':>7} {'peak':>7} {'model part':>10} {'after load':>10} {'s':>5}  dtype"]
    print("\n".join(lines), flush=True)
    alone = None
    for ranks in args.ranks:
        for row in run(model, ranks):
            part = (row["peak_kb"] - row["fixed_kb"]) / 1024
            held = (row["after_kb"] - row["fixed_kb"]) / 1024
            alone = (part, held) if ranks == 1 and alone is None else alone
            share = (f" (peak {part / alone[0]:.0%}, after load {held / alone[1]:.0%} of one process's)"
                     if alone and ranks > 1 else "")
            lines.append(f"{ranks:>5} {row['rank']:>4} {row['fixed_kb'] / 1024:>7.0f} {row['peak_kb'] / 1024:>7.0f} "
                         f"{part:>10.0f} {row['after_kb'] / 1024:>10.0f} {row['seconds']:>5.1f}  {row['dtype']}"
                         f"{share}")
            print(lines[-1], flush=True)
    lines.append("fixed: RSS with torch, transformers, peft and OpenRLHF imported and the process group up, before "
                 "any weight is read; model part: peak (VmHWM) at load less fixed.")
    print(lines[-1])
    if args.out:
        with args.out.open("a") as f:
            f.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()

"""The trainer on a GPU, in one command: training steps of the real `PolicyTrainer` on randomly initialised models
shaped like Qwen3 0.6B, 1.7B, 4B and 8B, and the log-probs of one small model computed on CUDA and on CPU.

    python bench/gpu_check.py                       # on a GPU machine: the four shapes, results to stdout
    python bench/gpu_check.py --out bench/results/gpu.txt
    python bench/gpu_check.py --shapes tiny         # on a CPU: the same code path at a tiny shape (CI runs this)
    python bench/gpu_check.py --carry .gpu-carry    # copy the pure-Python packages a bare CUDA machine lacks

Per shape, in a fresh process under torchrun with one rank (so the base goes through FSDP2's `fully_shard` exactly as
`rlproxy train --nproc-per-node N` runs it; trainer/sharding.py): the model is built from its shape with random
weights (nothing is downloaded), saved, and loaded by `PolicyTrainer` with LoRA r=32 on q, k, v, o, bfloat16 and
activation checkpointing, and again without it (the `no-ckpt` rows); one warm-up step, then `--steps` timed steps on a
fixed batch. Printed: tokens per second,
model FLOPs utilisation against the card's peak, the peak GPU memory (torch's allocator), and beside it what the
formula behind docs/scale.md's table (bench/scale.py, `per_gpu_gb`) predicts for the same shape and micro-batch.

Model FLOPs per step count the forward pass and the backward pass through the activations (LoRA's weight gradients
are negligible, the base's are never computed): 2 x (2 x linear parameters x tokens at each shape's head_dim +
attention + the LM head over the trained positions only, as trainer/logprobs.py scores them), plus the forward
passes a step makes besides: decoupled PPO's proximal pass over every mini-batch but the first, the base model's when
a KL is wanted. Activation checkpointing's recomputed decoder forward is extra hardware work and not counted (MFU);
HFU counts it. The prediction counts the root unit (embeddings, LM head) and two layers gathered whole beside the
shard, as FSDP2 holds them even over one rank.

Then the agreement of CUDA and CPU arithmetic: a small Qwen3-shaped model initialised from a fixed seed is saved once
and scored by `PolicyTrainer.logprobs` on the CPU (a child process with CUDA hidden) and on CUDA, in bfloat16 and in
float32; the mean and largest per-token log-prob differences are printed. (The bundled model's file is larger than
what can be carried to a GPU machine, hence a seeded one.)

A bare CUDA machine (torch, transformers and peft only) lacks OpenRLHF: `--carry DIR` copies it (pure Python) from
this environment into DIR; the script appends `.gpu-carry` under the repository to `sys.path` when it exists, after
the machine's own packages, so only what is missing is used. pydantic is not carried (its core is compiled for one
Python): where it is missing, the trainer's settings are read from core/settings/training.py with its defaults and
without its validation (`settings_without_pydantic`). The imports are checked first, and what is missing is said
in the report; each row is written to `--out` as soon as it is measured, and a part that fails is a row with its
error, so a run cut short leaves what it measured.

Modules: this one (the command line, the report, one torchrun per shape), bench/gpu_shapes.py (the shapes, FLOPs,
the prediction, the measurement inside a rank), bench/gpu_agreement.py (CUDA against CPU log-probs) and
bench/gpu_preflight.py (imports, settings without pydantic, --carry); none imports anything beyond the standard
library, torch, transformers, peft, the carried openrlhf and this repository's trainer/ and core/.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
CARRY = ROOT / ".gpu-carry"
if CARRY.is_dir():
    sys.path.append(str(CARRY))

try:
    import pydantic  # noqa: F401
except ImportError:  # a bare CUDA machine: the trainer's settings without it (bench/gpu_preflight.py)
    from gpu_preflight import settings_without_pydantic

    settings_without_pydantic()
from gpu_agreement import agreement, score  # noqa: E402
from gpu_preflight import carry, missing_imports  # noqa: E402
from gpu_shapes import RESULT, SHAPE_HEADER, SHAPES, child_env, measure, shape_row  # noqa: E402


# --- one shape, in a torchrun of its own --------------------------------------------------------------------------
def run_shape(args: argparse.Namespace, shape: str, checkpointing: bool, timeout: float) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", __file__,
               "measure", "--shape", shape, "--steps", str(args.steps), "--batch", str(args.batch),
               "--prompt", str(args.prompt), "--completion", str(args.completion)]
    command += ["--workdir", args.workdir] if args.workdir else []
    command += [] if checkpointing else ["--no-checkpointing"]
    label = {"shape": shape, "checkpointing": checkpointing}
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        return {**label, "error": f"did not finish within {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        return {**label, "error": f"exit {done.returncode}: {failure(done.stderr + done.stdout)}"}
    return json.loads(lines[-1][len(RESULT):])


def failure(output: str) -> str:
    """The exception a rank died of (its last line naming an error), else the output's last lines."""
    lines = [line.removeprefix("[rank0]: ").strip() for line in output.splitlines() if line.strip()]
    raised = [line for line in lines if "Error" in line.split(":")[0] and "ChildFailedError" not in line]
    return (raised[-1] if raised else " | ".join(lines[-6:]))[-1500:]


# --- the report -------------------------------------------------------------------------------------------------
class Report:
    """Lines printed and, with `--out`, appended to the file at once (flushed), so a run cut short keeps its rows."""

    def __init__(self, out: Path | None) -> None:
        self.file = out.open("a") if out else None

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.write("\n")
            self.file.close()


def report(args: argparse.Namespace, write: Report) -> bool:
    """Whether anything could be measured (False: an import is missing)."""
    started = time.monotonic()
    deadline = started + args.budget_s
    missing = missing_imports()
    write(f"## {time.strftime('%Y-%m-%d')} python bench/gpu_check.py --shapes {','.join(args.shapes)}")
    if missing:
        write(f"failed: missing imports: {'; '.join(missing)}. Install them, or run --carry DIR here and copy DIR "
              f"to .gpu-carry beside bench/ there (openrlhf is carried; torch, transformers and peft must be there).")
        return False
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (no CUDA)"
    pydantic_note = "" if "pydantic" in sys.modules else " (no pydantic here: settings without validation)"
    for line in (f"{device}, torch {torch.__version__}{pydantic_note}",
                 f"Each step: {args.batch} sequences of {args.prompt} prompt + {args.completion} completion tokens; "
                 f"LoRA r=32 on q,k,v,o; bfloat16; FSDP2 over one rank (torchrun); the trainer's other settings at "
                 f"their defaults; median of {args.steps} steps after a warm-up step; each shape with activation "
                 f"checkpointing and without (no-ckpt).",
                 "MFU: every epoch's forward + backward through the activations plus the proximal (and reference) "
                 "forward passes, at the card's dense bfloat16 peak; HFU adds the decoder forward checkpointing "
                 "recomputes. "
                 "'table says': bench/scale.py's per-GPU formula (docs/scale.md) for the shape (its head_dim, the "
                 "root and two layers gathered whole) at the trainer's micro-batch budget. build/load: seconds to "
                 "make the random model and to load it.",
                 "", SHAPE_HEADER):
        write(line)
    for shape in args.shapes:
        for checkpointing in (True, False) if args.without_checkpointing else (True,):
            left = deadline - time.monotonic() - args.reserve_s
            if left < 30:
                write(shape_row({"shape": shape, "checkpointing": checkpointing,
                                 "error": f"skipped: {args.budget_s:.0f} s budget spent"}))
                continue
            try:
                write(shape_row(run_shape(args, shape, checkpointing, timeout=left)))
            except Exception as error:  # the row says what broke; the next part still runs
                write(shape_row({"shape": shape, "checkpointing": checkpointing,
                                 "error": f"{type(error).__name__}: {error}"[:1500]}))
    write("")
    write("Log-probs of one seeded model (4 sequences of 192 + 64 tokens), against the CPU in float32:")
    try:
        for line in agreement(args.workdir, timeout=max(60.0, deadline - time.monotonic())):
            write(line)
    except Exception as error:
        write(f"agreement failed: {type(error).__name__}: {error}"[:1500])
    write(f"({time.monotonic() - started:.0f} s in all)")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode")
    inner = sub.add_parser("measure", help="(internal) one shape, inside its torchrun rank")
    inner.add_argument("--shape", required=True, choices=sorted(SHAPES))
    scorer = sub.add_parser("score", help="(internal) log-probs of the seeded model on this process's device")
    scorer.add_argument("--model", required=True)
    scorer.add_argument("--bf16", action="store_true")
    for p in (parser, inner):
        p.add_argument("--steps", type=int, default=2, help="timed steps per shape (after one warm-up step)")
        p.add_argument("--batch", type=int, default=8, help="sequences per step")
        p.add_argument("--prompt", type=int, default=1536, help="prompt tokens per sequence")
        p.add_argument("--completion", type=int, default=512, help="completion tokens per sequence")
        p.add_argument("--workdir", default=None, help="where the random models are written (default: the temp dir)")
    inner.add_argument("--no-checkpointing", dest="checkpointing", action="store_false",
                       help="train without activation checkpointing")
    parser.add_argument("--without-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure each shape without activation checkpointing")
    parser.add_argument("--shapes", type=lambda s: s.split(","),
                        default=["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"],
                        help=f"comma-separated, of: {', '.join(SHAPES)}")
    parser.add_argument("--budget-s", type=float, default=440.0,
                        help="wall time for everything; a shape that would start past it is skipped")
    parser.add_argument("--reserve-s", type=float, default=60.0, help="kept for the log-prob comparison at the end")
    parser.add_argument("--out", type=Path, help="also write the report here (appended)")
    parser.add_argument("--carry", type=Path, help="copy the pure-Python packages a bare CUDA machine lacks, and stop")
    args = parser.parse_args()
    if args.mode == "measure":
        return measure(args)
    if args.mode == "score":
        return score(args)
    if args.carry:
        return carry(args.carry)
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; known: {', '.join(SHAPES)}")
    write = Report(args.out)
    try:
        measured = report(args, write)
    finally:
        write.close()
    if not measured:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""The trainer on a GPU, in one command: training steps of the real `PolicyTrainer` on randomly initialised models
shaped like Qwen3 0.6B, 1.7B, 4B and 8B, and the log-probs of one small model computed on CUDA and on CPU.

    python bench/gpu_check.py                       # on a GPU machine: the four shapes, results to stdout
    python bench/gpu_check.py --out bench/results/gpu.txt
    python bench/gpu_check.py --shapes tiny         # on a CPU: the same code path at a tiny shape (CI runs this)
    python bench/gpu_check.py --carry .gpu-carry    # copy the pure-Python packages a bare CUDA machine lacks

Per shape, in a fresh process under torchrun with one rank (so the base goes through FSDP2's `fully_shard` exactly as
`rlproxy train --nproc-per-node N` runs it; trainer/sharding.py): the model is built from its shape with random
weights (nothing is downloaded), saved, and loaded by `PolicyTrainer` with LoRA r=32 on q, k, v, o, bfloat16 and
activation checkpointing; one warm-up step, then `--steps` timed steps on a fixed batch. Printed: tokens per second,
model FLOPs utilisation against the card's peak, the peak GPU memory (torch's allocator), and beside it what the
formula behind docs/scale.md's table (bench/scale.py, `per_gpu_gb`) predicts for the same shape and micro-batch.

Model FLOPs per step count the forward pass and the backward pass through the activations (LoRA's weight gradients
are negligible, the base's are never computed): 2 x (2 x linear parameters x tokens + attention + the LM head over
the completion positions only, as trainer/logprobs.py scores them). Activation checkpointing's recomputed forward is
extra hardware work and not counted (MFU); HFU counts it.

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
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
from gpu_preflight import carry, missing_imports  # noqa: E402

RESULT = "RESULT "
GB = 1e9
# Published Qwen3 configurations (config.json): hidden, intermediate, layers, heads, kv heads, head dim, tied LM head.
SHAPES = {
    "qwen3-0.6b": dict(hidden=1024, intermediate=3072, layers=28, heads=16, kv_heads=8, head_dim=128, tied=True),
    "qwen3-1.7b": dict(hidden=2048, intermediate=6144, layers=28, heads=16, kv_heads=8, head_dim=128, tied=True),
    "qwen3-4b": dict(hidden=2560, intermediate=9728, layers=36, heads=32, kv_heads=8, head_dim=128, tied=True),
    "qwen3-8b": dict(hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, head_dim=128, tied=False),
    # CPU-sized, for CI: the same code path in seconds.
    "tiny": dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, tied=True, vocab=512),
}
QWEN3_VOCAB = 151936
# Dense bfloat16 tensor-core peaks (no sparsity), by a substring of torch.cuda.get_device_name().
PEAK_BF16 = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "GH200": 989e12, "A100": 312e12, "L40S": 362e12,
             "B200": 2250e12}


# --- a model of a given shape, with random weights ---------------------------------------------------------------
def model_config(shape: dict):
    import transformers

    kwargs = dict(vocab_size=shape.get("vocab", QWEN3_VOCAB), hidden_size=shape["hidden"],
                  intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
                  num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                  head_dim=shape["head_dim"], tie_word_embeddings=shape["tied"], max_position_embeddings=40960)
    # Qwen3 where this transformers has it; Llama has the same projections (no q/k norm) for an older one.
    config_class = getattr(transformers, "Qwen3Config", None) or transformers.LlamaConfig
    return config_class(**kwargs)


def save_random_model(shape: dict, folder: Path, device: str, dtype: str, seed: int = 0) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    # Initialised where it is fast (on the GPU an 8B model takes seconds) and in its dtype from the start; the
    # default dtype rather than a keyword, which transformers renamed (torch_dtype -> dtype) between versions.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(model_config(shape))
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(folder, max_shard_size="50GB")
    del model
    if device == "cuda":
        torch.cuda.empty_cache()


def fixed_batch(vocab: int, count: int, prompt: int, completion: int, seed: int = 0):
    import torch

    from trainer.transitions import Transition

    g = torch.Generator().manual_seed(seed)
    batch = []
    for i in range(count):
        ids = torch.randint(0, vocab, (prompt + completion,), generator=g).tolist()
        behaviour = (-torch.rand(completion, generator=g) * 3).tolist()
        batch.append(Transition(ids[:prompt], ids[prompt:], behaviour, advantage=1.0 if i % 2 else -1.0))
    return batch


# --- what the formulas say ----------------------------------------------------------------------------------
def forward_flops(shape: dict, vocab: int, prompt: int, completion: int, lora_params: int) -> float:
    """FLOPs of one forward pass over one sequence: the decoder's matmuls, causal attention, the LM head at the
    completion positions only (trainer/logprobs.py) and LoRA's two small matmuls."""
    h, i, d = shape["hidden"], shape["intermediate"], shape["heads"] * shape["head_dim"]
    kv = shape["kv_heads"] * shape["head_dim"]
    tokens = prompt + completion
    linear = shape["layers"] * (h * d + 2 * h * kv + d * h + 3 * h * i)
    attention = shape["layers"] * 2 * tokens * tokens * d  # QK^T and AV, each 2*T*T*d, halved by the causal mask
    return 2 * linear * tokens + attention + 2 * vocab * h * completion + 2 * lora_params * tokens


def predicted_gb(shape: dict, vocab: int, micro_batch_tokens: int, checkpointing: bool) -> float:
    """docs/scale.md's per-GPU formula (bench/scale.py) for this shape on one rank under torchrun: its own head_dim
    and tied head, and the root unit plus two layers gathered whole beside the shard (FSDP2's all-gather writes a
    buffer of its own even for one rank)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import scale

    table_shape = dict(layers=shape["layers"], hidden=shape["hidden"], intermediate=shape["intermediate"],
                       heads=shape["heads"], kv_heads=shape["kv_heads"], head_dim=shape["head_dim"],
                       tied=shape["tied"], vocab=vocab)
    coefficient = measured_activation_coefficient()
    act = scale.activation_bytes(table_shape, coefficient, checkpointing=checkpointing)
    return scale.per_gpu_gb(table_shape, 1, micro_batch_tokens, act, offload=False, sharded=True)


def measured_activation_coefficient(default: float = 7.8) -> float:
    """The activation coefficient bench/scale.py measured (its committed output), which the table uses."""
    text = (ROOT / "bench" / "results" / "scale.txt").read_text() if (ROOT / "bench/results/scale.txt").exists() else ""
    marker = " values of (hidden + intermediate"
    for line in text.splitlines():
        if marker in line and "= " in line:
            try:
                return float(line.split(marker)[0].rsplit("= ", 1)[1].split()[-1])
            except (IndexError, ValueError):
                continue
    return default


def step_flops(shape: dict, vocab: int, batch: list, lora: int, config, checkpointing: bool) -> tuple[float, float]:
    """(model, hardware) FLOPs of one trainer step over `batch`. Model: every epoch's forward and backward through
    the activations (about twice the forward), plus the forward passes the step needs besides: decoupled PPO's
    proximal pass over every mini-batch but the first (trainer/ppo.py), the base model's pass when a KL is wanted.
    Hardware adds the forward that activation checkpointing recomputes in every epoch's backward."""
    forward = sum(forward_flops(shape, vocab, len(t.prompt_ids), len(t.completion_ids), lora) for t in batch)
    shares = max(1, min(config.mini_batches, len(batch)))
    extra = forward * (shares - 1) / shares if config.proximal_policy == "recomputed" else 0.0
    extra += forward if config.needs_reference else 0.0
    model = 2 * forward * config.ppo_epochs + extra
    return model, model + (forward * config.ppo_epochs if checkpointing else 0.0)


def peak_flops(device_name: str) -> float | None:
    return next((peak for name, peak in PEAK_BF16.items() if name in device_name), None)


# --- one shape, inside its torchrun rank -------------------------------------------------------------------------
def measure(args: argparse.Namespace) -> None:
    import torch

    from core.settings import TrainingSettings
    from trainer import parallel
    from trainer.ppo import PolicyTrainer

    shape = SHAPES[args.shape]
    vocab = shape.get("vocab", QWEN3_VOCAB)
    cuda = torch.cuda.is_available()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.workdir) as folder:
        save_random_model(shape, Path(folder), "cuda" if cuda else "cpu", "bfloat16" if cuda else "float32")
        built = time.perf_counter() - started
        collective = parallel.init_from_environment()
        config = TrainingSettings(lora_rank=32, lora_alpha=64, bf16=True, activation_checkpointing=args.checkpointing,
                                  max_seq_len=args.prompt + args.completion, seed=0)
        policy = PolicyTrainer(folder, config, collective=collective)
    loaded = time.perf_counter() - started - built
    batch = fixed_batch(vocab, args.batch, args.prompt, args.completion)
    policy.step(batch)  # warm-up: kernels, allocator
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    walls = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        metrics = policy.step(batch)
        if cuda:
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    lora = sum(p.numel() for n, p in policy.model.named_parameters() if "lora_" in n) * collective.world_size
    wall = statistics.median(walls)
    model_flops, hardware_flops = step_flops(shape, vocab, batch, lora, policy.config, args.checkpointing)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak = peak_flops(name) if cuda else None
    result = {
        "shape": args.shape, "device": name, "parameters": sum(p.numel() for p in policy.model.parameters()),
        "lora": lora, "tokens": metrics.tokens, "tokens_per_s": metrics.tokens / wall, "step_s": wall,
        "updates": metrics.updates, "micro_batch_tokens": policy.config.micro_batch_tokens,
        "model_tflops_per_s": model_flops / wall / 1e12,
        "mfu": model_flops / wall / peak if peak else None,
        "hfu": hardware_flops / wall / peak if peak else None,
        "peak_gb": torch.cuda.max_memory_allocated() / GB if cuda else None,
        "reserved_gb": torch.cuda.max_memory_reserved() / GB if cuda else None,
        "predicted_gb": predicted_gb(shape, vocab, policy.config.micro_batch_tokens, args.checkpointing),
        "checkpointing": args.checkpointing,
        "build_s": built, "load_s": loaded, "loss": metrics.loss, "autocast": policy.autocast_enabled,
    }
    if collective.rank == 0:
        print(RESULT + json.dumps(result), flush=True)
    torch.distributed.destroy_process_group()


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH (whatever else was there stays)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


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


def shape_row(r: dict) -> str:
    name = r["shape"] + ("" if r.get("checkpointing", True) else " no-ckpt")
    if "error" in r:
        return f"{name:<20} failed: {r['error']}"

    def pct(value):
        return f"{100 * value:5.1f}%" if value is not None else "   n/a"

    def gb(value):
        return f"{value:6.1f} GB" if value is not None else "     n/a"

    return (f"{name:<20}{r['parameters'] / 1e9:7.2f}B{r['lora'] / 1e6:7.1f}M{r['tokens']:>8}{r['step_s']:8.2f}"
            f"{r['tokens_per_s']:>10.0f}{r['model_tflops_per_s']:>9.1f}  {pct(r['mfu'])}  {pct(r['hfu'])}"
            f"  {gb(r['peak_gb'])}  {gb(r['reserved_gb'])}  {gb(r['predicted_gb'])}"
            f"{r['build_s']:7.0f}{r['load_s']:6.0f}")


SHAPE_HEADER = (f"{'shape':<20}{'params':>8}{'LoRA':>8}{'tokens':>8}{'step s':>8}{'tokens/s':>10}{'TFLOP/s':>9}"
                f"  {'MFU':>6}  {'HFU':>6}  {'peak alloc':>9}  {'reserved':>9}  {'table says':>9}{'build':>7}"
                f"{'load':>6}")


# --- CUDA and CPU arithmetic on the same weights ---------------------------------------------------------------
AGREEMENT_SHAPE = dict(hidden=256, intermediate=768, layers=4, heads=4, kv_heads=2, head_dim=64, tied=True, vocab=32768)


def score(args: argparse.Namespace) -> None:
    """(child) Per-token log-probs of the fixed batch under the seeded model, on whatever device this process sees."""
    import torch

    from core.settings import TrainingSettings
    from trainer.ppo import PolicyTrainer

    policy = PolicyTrainer(args.model, TrainingSettings(bf16=args.bf16, seed=0))
    batch = fixed_batch(AGREEMENT_SHAPE["vocab"], 4, 192, 64, seed=1)
    scores = policy.logprobs(batch, adapter=False)  # LoRA B starts at zero: the base model's log-probs
    print(RESULT + json.dumps({"device": str(policy.device), "autocast": policy.autocast_enabled,
                               "torch": torch.__version__, "logprobs": scores}), flush=True)


def scored(model: Path, bf16: bool, cpu: bool, timeout: float) -> dict:
    env = child_env(**({"CUDA_VISIBLE_DEVICES": ""} if cpu else {}))
    command = [sys.executable, __file__, "score", "--model", str(model)] + (["--bf16"] if bf16 else [])
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"scoring failed (exit {done.returncode}): {done.stderr[-1500:]}")
    return json.loads(lines[-1][len(RESULT):])


def agreement(workdir: str | None, timeout: float) -> Iterator[str]:
    """Lines, one per comparison as it is computed; a comparison that fails is a line with its error."""
    import torch

    with tempfile.TemporaryDirectory(dir=workdir) as folder:
        save_random_model(AGREEMENT_SHAPE, Path(folder), "cpu", "float32", seed=1234)
        reference = scored(Path(folder), bf16=False, cpu=True, timeout=timeout)
        flat = [x for row in reference["logprobs"] for x in row]
        yield (f"reference: cpu float32 (torch {reference['torch']}), {len(flat)} completion tokens, mean log-prob "
               f"{statistics.fmean(flat):.4f}")
        others = [("cpu, bfloat16 where fast", True, True)]
        if torch.cuda.is_available():
            others += [("cuda, float32", False, False), ("cuda, bfloat16", True, False)]
        for label, bf16, cpu in others:
            try:
                other = scored(Path(folder), bf16=bf16, cpu=cpu, timeout=timeout)
            except Exception as error:
                yield f"{label:<26} failed: {type(error).__name__}: {error}"[:1500]
                continue
            diffs = [abs(a - b) for ra, rb in zip(reference["logprobs"], other["logprobs"]) for a, b in zip(ra, rb)]
            yield (f"{label:<26} (computed in {'bfloat16' if other['autocast'] else 'float32'} on "
                   f"{other['device']}): mean |diff| {statistics.fmean(diffs):.2e}, max |diff| {max(diffs):.2e}")
    if not torch.cuda.is_available():
        yield "cuda: not available here; only the CPU rows were computed"


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
                 "forward passes, at the card's dense bfloat16 peak; HFU adds the forward checkpointing recomputes. "
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

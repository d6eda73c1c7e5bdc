"""Peak resident memory of `rlproxy demo`, per process and summed; and of the trainer alone, before and after its
memory work, measured in one run.

    .venv/bin/python bench/memory.py demo --minutes 6     # a real headless demo run (engine start and the base
                                                          # evaluation come on top of the minutes)
    .venv/bin/python bench/memory.py trainer              # trainer steps on demo-shaped transitions, as it was
                                                          # and as it is, each in a process of its own

demo: the demo is one process (proxy, trainer and agents share it) plus the engine's process tree (a guard, vLLM's
API server, its engine core and worker, and what they spawn). Every process's peak is the kernel's own record
(VmHWM in /proc/<pid>/status: a spike between two samples still counts), read every `--interval` seconds while
the process lives. "sum of peaks" adds them up: an upper bound, as if every process peaked at once. "peak of the
sum" is the largest total RSS seen in one sample: what the machine needed at once (sampled, so a lower bound).

trainer: each variant runs in a fresh process: the bundled model, the demo's training settings, the same synthetic
transitions shaped like the demo's (about 230 prompt and 50 completion tokens, a third of them context), one
warm-up step, then `--steps` measured ones. The step's peak is VmHWM after resetting it (/proc/self/clear_refs)
before the step. Variants:
  before   the full-vocabulary log-softmax over each micro-batch, 4096-token micro-batches, glibc's default
           allocator behaviour (what the trainer did before)
  after    the trainer as it is: trainer/logprobs.py, trainer/memory.py, and 384-token micro-batches on CPU
Timings are wall and CPU seconds per step, medians; on a shared 2-core machine they are noisy.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit.processes import free_port  # noqa: E402

GB = 1e9


# --- the demo's processes ---------------------------------------------------------------------------------
def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in bytes ({} once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.startswith(("VmRSS", "VmHWM"))}
    except (OSError, ValueError, IndexError):
        return {}


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            tree.setdefault(parent, []).append(int(name))
    return tree


def _descendants(root: int) -> list[int]:
    tree, found, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, []))
    return found


def _label(pid: int, root: int, root_label: str) -> str:
    """What the process is. vLLM names its processes (VLLM::EngineCore, VLLM::Worker) only once they run, so
    this is asked again at every sample."""
    if pid == root:
        return root_label
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return f"pid {pid}"
    if argv[0].startswith("VLLM::") or comm.startswith("VLLM::"):  # comm is cut at 15 characters, argv[0] is not
        return "engine: " + (argv[0] if argv[0].startswith("VLLM::") else comm).removeprefix("VLLM::")
    if len(argv) > 1 and argv[1] == "-c" and "killpg" in argv[2]:
        return "engine: guard (engine/local.py)"
    if "vllm.entrypoints" in " ".join(argv[:3]):
        return "engine: API server"
    if "resource_tracker" in " ".join(argv):
        return "engine: multiprocessing resource tracker"
    if "spawn_main" in " ".join(argv):
        return "engine: a process starting (spawn)"
    return f"engine: {comm} (other)"


class Watch:
    """Per-process peaks and the peak of the summed RSS of a process tree, sampled."""

    def __init__(self, root: int, root_label: str = "demo: proxy + trainer + agents") -> None:
        self.root = root
        self.root_label = root_label
        self.peaks: dict[int, tuple[str, int]] = {}  # pid -> (label, VmHWM)
        self.sum_peak = 0

    def sample(self) -> None:
        total = 0
        for pid in _descendants(self.root):
            status = _status(pid)
            if not status:
                continue
            total += status["VmRSS"]
            peak = max(status["VmHWM"], self.peaks.get(pid, ("", 0))[1])
            self.peaks[pid] = (_label(pid, self.root, self.root_label), peak)
        self.sum_peak = max(self.sum_peak, total)


def run_demo(minutes: float, interval: float, extra: list[str]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="rlproxy-memory-"))
    command = [sys.executable, "-m", "rlproxy.cli", "demo", "--headless", "--minutes", str(minutes),
               "--workdir", str(workdir), "--database-url", f"sqlite+aiosqlite:///{workdir / 'rlproxy.db'}",
               "--port", str(free_port()), "--engine-port", str(free_port()), *extra]
    print("running:", " ".join(command[1:]), flush=True)
    began = time.monotonic()
    with open(workdir / "demo.log", "w") as log:
        demo = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
        watch = Watch(demo.pid)
        while demo.poll() is None:
            watch.sample()
            time.sleep(interval)
    print(f"demo exited {demo.returncode} after {(time.monotonic() - began) / 60:.1f} min; logs in {workdir}")
    rows = sorted(watch.peaks.values(), key=lambda row: -row[1])  # each process once, by its last label
    print(f"\n{'process':<52}{'peak RSS':>10}")
    for label, peak in rows:
        if peak >= 0.01 * GB:
            print(f"{label:<52}{peak / GB:>8.2f} GB")
    engine = sum(peak for pid, (_, peak) in watch.peaks.items() if pid != demo.pid)  # its only children
    print(f"{'engine processes, sum of peaks':<52}{engine / GB:>8.2f} GB")
    print(f"{'all, sum of peaks':<52}{sum(p for _, p in rows) / GB:>8.2f} GB")
    print(f"{'all, peak of the sum (sampled every %gs)' % interval:<52}{watch.sum_peak / GB:>8.2f} GB")
    state = workdir / "rlproxy-demo.json"
    if state.exists():
        run = json.loads(state.read_text())["last_run"]
        print(f"training: {run['versions']} versions from {run['episodes']} episodes in {run['minutes']:.1f} min")


# --- the trainer alone ------------------------------------------------------------------------------------
def run_trainer(variants: list[str], steps: int) -> None:
    results = {}
    for variant in variants:
        out = subprocess.run([sys.executable, __file__, "trainer-step", variant, "--steps", str(steps)],
                             capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            sys.exit(f"{variant} failed:\n{out.stderr[-3000:]}")
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n{'variant':<8}{'start-up peak':>15}{'step peak':>11}{'after step':>12}{'wall s/step':>13}"
          f"{'CPU s/step':>12}{'micro-batches':>15}  loss")
    for variant, r in results.items():
        print(f"{variant:<8}{r['init_peak'] / GB:>12.2f} GB{r['step_peak'] / GB:>8.2f} GB{r['after'] / GB:>9.2f} GB"
              f"{r['wall']:>13.1f}{r['cpu']:>12.1f}{r['micro_batches']:>15}  {r['loss']:.6f}")
    if {"before", "after"} <= results.keys():
        b, a = results["before"], results["after"]
        print(f"after / before: step peak {a['step_peak'] / b['step_peak']:.2f}, wall {a['wall'] / b['wall']:.2f}, "
              f"CPU {a['cpu'] / b['cpu']:.2f}")


def trainer_step(variant: str, steps: int) -> None:
    """One variant in this process; prints one JSON line."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as bench/train_step.py: spinning threads stall shared cores
    import dataclasses

    import torch

    from demo.run import DemoSettings
    from engine.model import prepare_model
    from trainer import ppo
    from trainer.transitions import Transition

    config = DemoSettings().training
    trainer_class = ppo.PolicyTrainer
    if variant == "before":
        config = dataclasses.replace(config, micro_batch_tokens=4096)  # the default then
        ppo.tune_allocator = ppo.release_free_memory = lambda: None  # glibc's own behaviour
        trainer_class = _full_vocabulary_trainer(ppo.PolicyTrainer)
    trainer = trainer_class(prepare_model(), config)
    init_peak = _status(os.getpid())["VmHWM"]
    g = torch.Generator().manual_seed(0)
    batch = []
    for i in range(16):
        prompt = int(230 * (0.85 + 0.3 * float(torch.rand((), generator=g))))
        completion = int(50 * (0.5 + float(torch.rand((), generator=g))))
        mask = [0 if completion // 3 <= j < 2 * completion // 3 else 1 for j in range(completion)]
        ids = torch.randint(0, trainer.model.config.vocab_size, (prompt + completion,), generator=g).tolist()
        batch.append(Transition(prompt_ids=ids[:prompt], completion_ids=ids[prompt:],
                                behaviour_logprobs=[-5.0] * completion, advantage=1.0 if i % 2 else -1.0,
                                loss_mask=mask))
    trainer.step(batch)  # warm-up
    walls, cpus, peaks = [], [], []
    for _ in range(steps):
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        wall, cpu = time.perf_counter(), time.process_time()
        metrics = trainer.step(batch)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        peaks.append(_status(os.getpid())["VmHWM"])
    print(json.dumps({"init_peak": init_peak, "step_peak": max(peaks), "after": _status(os.getpid())["VmRSS"],
                      "wall": statistics.median(walls), "cpu": statistics.median(cpus),
                      "micro_batches": metrics.micro_batches, "loss": metrics.loss}))


def _full_vocabulary_trainer(base: type) -> type:
    import torch

    class FullVocabularyTrainer(base):
        """Scores as the trainer did before trainer/logprobs.py: the LM head over every position from the first
        completion on, then log-softmax over the whole [rows, positions, vocabulary] tensor."""

        def _forward(self, mb):
            position_ids = (mb.attention_mask.cumsum(-1) - 1).masked_fill(mb.attention_mask == 0, 1)
            keep = torch.arange(mb.start, mb.input_ids.shape[1] - 1)
            logits = self.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=position_ids,
                                logits_to_keep=keep).logits.float()
            logp = torch.log_softmax(logits / self.config.temperature, dim=-1)
            chosen = logp.gather(-1, mb.input_ids[:, mb.start + 1:].unsqueeze(-1)).squeeze(-1)
            with torch.no_grad():
                entropy = -(logp.exp() * logp).sum(-1)
            return chosen, entropy

    return FullVocabularyTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    demo = sub.add_parser("demo", help="a real headless `rlproxy demo` run")
    demo.add_argument("--minutes", type=float, default=6.0, help="training minutes (--minutes of rlproxy demo)")
    demo.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    demo.add_argument("demo_args", nargs="*", help="more `rlproxy demo` arguments, after --")
    trainer = sub.add_parser("trainer", help="trainer steps alone: before and after")
    trainer.add_argument("--variants", default="before,after")
    trainer.add_argument("--steps", type=int, default=3, help="measured steps per variant, after one warm-up")
    child = sub.add_parser("trainer-step")
    child.add_argument("variant", choices=["before", "after"])
    child.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if args.mode == "demo":
        run_demo(args.minutes, args.interval, args.demo_args)
    elif args.mode == "trainer":
        run_trainer(args.variants.split(","), args.steps)
    else:
        trainer_step(args.variant, args.steps)


if __name__ == "__main__":
    main()

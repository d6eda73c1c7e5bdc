"""Peak memory and time of the LM head's part of a training micro-batch on CPU: the plain projection, the chunked one
over every completion position (the trainer before), and the chunked one over the trained positions only (a step's
micro-batches now, trainer/logprobs.py), at several rows per chunk.

    python bench/lm_head.py --out bench/results/lm_head.txt

The shape keeps Qwen3-8B's ratio of vocabulary to hidden size (151,936 / 4,096 = 37) at a width a CPU computes in
seconds: hidden 512, vocabulary 18,944. One micro-batch of 4,096 tokens, of which `--completion` are completion
positions and `--trained` of those were sampled by the model (an agent's merged turns: the tool results and user
turns between its sampled spans are completion positions with loss mask 0). Each case runs forward and backward
(the gradient reaches the hidden states, as the decoder's LoRA layers need it) in a process of its own; its peak is
the rise of the process's peak resident memory over what it held before the case. The log-probs of the trained
positions are checked to equal the plain computation's.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HIDDEN, VOCAB = 512, 18_944


def _case(name: str, rows: int, completion: int, trained: int, repeats: int) -> dict:
    import torch

    from trainer.logprobs import token_scores

    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).requires_grad_(False)
    hidden_all = torch.randn(completion, HIDDEN) * 0.5
    targets_all = torch.randint(0, VOCAB, (completion,))
    keep = torch.zeros(completion, dtype=torch.bool)
    keep[torch.randperm(completion, generator=torch.Generator().manual_seed(1))[:trained]] = True
    projected = keep if name == "chunked, trained positions" else torch.ones_like(keep)
    before = _rss_bytes()
    started = time.perf_counter()
    for _ in range(repeats):
        hidden = hidden_all.clone().requires_grad_(True)
        where = projected.nonzero()[:, 0]
        if name == "plain":  # log_softmax(head(hidden)) over every completion position, autograd's backward
            logp = torch.log_softmax(head(hidden[where]).float(), dim=-1)
            chosen = logp.gather(1, targets_all[where, None]).squeeze(1)
        else:
            chosen = token_scores(hidden[where], head, targets_all[where], rows=rows).logprobs
        mask = keep[where].float()  # the loss reads the trained positions only
        (chosen * mask).sum().backward()
    seconds = (time.perf_counter() - started) / repeats
    peak = _peak_bytes() - before
    with torch.no_grad():  # the trained positions' log-probs against the plain computation's
        plain = torch.log_softmax(head(hidden_all[keep]), -1).gather(1, targets_all[keep, None]).squeeze(1)
        mine = dict(zip(where.tolist(), chosen.detach().tolist()))
        error = max(abs(mine[i] - float(p)) for i, p in zip(keep.nonzero()[:, 0].tolist(), plain))
    return {"case": name, "rows": rows, "projected": int(projected.sum()), "seconds": seconds,
            "peak_mb": peak / 2**20, "max_abs_error": error}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--completion", type=int, default=3072)
    parser.add_argument("--trained", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in a process of its own
    args = parser.parse_args()
    if args.case:
        import torch

        torch.set_num_threads(args.threads)
        name, rows = json.loads(args.case)
        print(json.dumps(_case(name, rows, args.completion, args.trained, args.repeats)))
        return
    from trainer.logprobs import chunk_rows

    cpu_rows = chunk_rows(VOCAB)
    cases = [("plain", 0)] + [("chunked, every completion position", cpu_rows)] + [
        ("chunked, trained positions", rows) for rows in (cpu_rows, 4 * cpu_rows, 16 * cpu_rows)]
    lines = [f"# python bench/lm_head.py --completion {args.completion} --trained {args.trained} "
             f"(hidden {HIDDEN}, vocabulary {VOCAB}: Qwen3-8B's ratio; {args.threads} CPU threads; forward + backward "
             f"of one micro-batch's LM head, mean of {args.repeats})",
             "| case | rows per chunk | positions projected | seconds | peak MB | max abs error vs plain |",
             "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name, rows in cases:
        done = subprocess.run([sys.executable, __file__, "--case", json.dumps([name, rows]), "--completion",
                               str(args.completion), "--trained", str(args.trained), "--repeats", str(args.repeats),
                               "--threads", str(args.threads)], check=True, capture_output=True, text=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        line = (f"| {r['case']} | {r['rows'] or 'all'} | {r['projected']} | {r['seconds']:.3f} | {r['peak_mb']:.0f} | "
                f"{r['max_abs_error']:.1e} |")
        print(line, flush=True)
        lines.append(line)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

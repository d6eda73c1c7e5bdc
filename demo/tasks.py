"""The demo's task families, generated locally from a seeded RNG (nothing is downloaded).

Each task is a question the bundled 135M model cannot answer from memory but can answer with a tool:

    mul2x2   "What is 37 * 46?"          two-digit times two-digit; tool: calc      (the default)
    mul1x2   "What is 37 * 6?"           two-digit times one-digit; tool: calc
    mul3x2   "What is 537 * 46?"         three-digit times two-digit; tool: calc
    lookup   "What is the code of the silver otter?"   a made-up table bundled below; tool: lookup
    chain    "What is the code of the silver otter times 7?"   both tools in turn: LOOKUP, then CALC on its
             RESULT, then ANSWER (at least three model calls, each continuing the conversation before it)

Train, gate and held-out splits are disjoint by construction: every problem (for multiplication the unordered
operand pair, so 37 * 46 and 46 * 37 land on the same side; for lookup and chain the table key, so a held-out
chain problem names an item whose code no training problem ever showed) is assigned to a
split by a hash of its key, so the held-out problems are the same kind of problem, never seen in
training. Within a split, `train_tasks(n, seed)` / `heldout_tasks(n, seed)` draw n distinct problems
with a string-seeded `random.Random`, so the same arguments give the same tasks on every machine.

The task_id names the problem (for example ``mul2x2:37*46``): a GRPO group is the set of rollouts that
share a task_id, so repeating a task in a batch is how the trainer forms groups.
"""
from __future__ import annotations

import functools
import hashlib
import random
import re
from dataclasses import dataclass

DEFAULT_FAMILY = "words2x2"
HELDOUT_SHARE = 5  # one problem in five is held out (what held-out numbers are reported on)
GATE_BUCKET = 1  # of ten hash buckets, this one is the gate split (what the demo's gate decides on)

CALC = "calc"
LOOKUP = "lookup"
CHAIN = "chain"  # the task kind whose episodes use LOOKUP, then CALC

# Problems the agent's few-shot prompt shows worked through; never drawn into either split.
EXAMPLE_PRODUCTS: tuple[tuple[int, int], ...] = ((23, 41), (58, 17), (64, 29))
EXAMPLE_LOOKUPS: tuple[str, ...] = ("golden heron", "jade lynx", "coral owl")
EXAMPLE_CHAINS: tuple[tuple[str, int], ...] = (("golden heron", 3), ("jade lynx", 7))
CHAIN_FACTORS = range(3, 10)  # "times 3" .. "times 9": one-digit factors, so the CALC step is the easy part


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str
    answer: str | int
    tool: str = CALC  # the tool that solves it: "calc" or "lookup"
    family: str = DEFAULT_FAMILY
    split: str = "train"


@dataclass(frozen=True)
class _Multiplication:
    a_range: tuple[int, int]  # inclusive
    b_range: tuple[int, int]
    words: bool = False  # a short word problem instead of "What is a * b?"


# Word problems: the model has to write the product itself; each names `a` first, then `b`.
WORD_TEMPLATES: tuple[str, ...] = (
    "A box holds {a} rows of {b} eggs. How many eggs are in the box?",
    "Each of {a} buses carries {b} people. How many people are on the buses?",
    "A shelf has {a} books with {b} pages each. How many pages is that in total?",
    "{a} students each bring {b} pencils. How many pencils do they bring?",
    "A garden has {a} rows with {b} plants in each row. How many plants are there?",
    "A ticket costs {b} dollars. How many dollars do {a} tickets cost?",
)


FAMILIES: dict[str, object] = {
    "mul1x2": _Multiplication((12, 99), (3, 9)),
    "mul2x2": _Multiplication((12, 99), (12, 99)),
    "mul3x2": _Multiplication((102, 999), (12, 99)),
    "words2x2": _Multiplication((12, 99), (12, 99), words=True),
    "lookup": None,  # the bundled table
    "chain": None,  # the bundled table, each code times a one-digit factor
}

# --- the lookup table: 12 x 12 made-up objects with three-digit codes, fixed forever ----------------

_COLOURS = ("amber", "azure", "coral", "crimson", "golden", "indigo", "ivory", "jade", "olive", "scarlet",
            "silver", "violet")
_ANIMALS = ("badger", "beetle", "falcon", "heron", "lizard", "lynx", "otter", "owl", "panda", "salmon",
            "tiger", "walrus")


@functools.cache
def lookup_table() -> dict[str, int]:
    """name -> code for the lookup family ("silver otter" -> a three-digit number)."""
    rng = random.Random("rlproxy-demo-lookup-table-v1")
    return {f"{colour} {animal}": rng.randint(100, 999) for colour in _COLOURS for animal in _ANIMALS}


def normalize_key(text: str) -> str:
    """How the lookup tool reads a name: casefolded, quotes/punctuation and a leading 'the' dropped."""
    text = re.sub(r"[\"'`*.,;:!?()\[\]]", " ", text).casefold()
    words = text.split()
    if words and words[0] == "the":
        words = words[1:]
    return " ".join(words)


def lookup(name: str) -> int | None:
    """The code for `name` in the bundled table, or None."""
    return lookup_table().get(normalize_key(name))


# --- splits ----------------------------------------------------------------------------------------


def split_of(family: str, key: str) -> str:
    """'heldout' for one problem key in HELDOUT_SHARE (by hash), 'gate' for one in ten, 'train' for the rest.
    The gate split keeps what a gate decides on apart from what held-out numbers are reported on."""
    bucket = int.from_bytes(hashlib.sha256(f"{family}|{key}".encode()).digest()[:8], "big")
    if bucket % HELDOUT_SHARE == 0:
        return "heldout"
    return "gate" if bucket % 10 == GATE_BUCKET else "train"


def _mul_key(a: int, b: int) -> str:
    lo, hi = sorted((a, b))
    return f"{lo}*{hi}"


def _mul_task(family: str, a: int, b: int, split: str) -> Task:
    if FAMILIES[family].words:
        k = int.from_bytes(hashlib.sha256(f"template|{a}|{b}".encode()).digest()[:4], "big") % len(WORD_TEMPLATES)
        prompt = WORD_TEMPLATES[k].format(a=a, b=b)
        return Task(task_id=f"{family}:{k}:{a}*{b}", prompt=prompt, answer=a * b, tool=CALC, family=family,
                    split=split)
    return Task(task_id=f"{family}:{a}*{b}", prompt=f"What is {a} * {b}?", answer=a * b, tool=CALC,
                family=family, split=split)


def _lookup_task(name: str, split: str) -> Task:
    return Task(task_id=f"lookup:{name.replace(' ', '-')}", prompt=f"What is the code of the {name}?",
                answer=lookup_table()[name], tool=LOOKUP, family="lookup", split=split)


def _chain_task(name: str, factor: int, split: str) -> Task:
    return Task(task_id=f"chain:{name.replace(' ', '-')}*{factor}",
                prompt=f"What is the code of the {name} times {factor}?",
                answer=lookup_table()[name] * factor, tool=CHAIN, family="chain", split=split)


@functools.cache
def _pool(family: str, split: str) -> tuple[tuple, ...]:
    """Every problem of `family` in `split`, in a fixed order."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; one of {sorted(FAMILIES)}")
    if family == "lookup":
        return tuple((name,) for name in lookup_table()
                     if name not in EXAMPLE_LOOKUPS and split_of(family, name) == split)
    if family == "chain":  # split by the item, not the pair: a held-out code was never seen in training
        return tuple((name, factor) for name in lookup_table()
                     if name not in EXAMPLE_LOOKUPS and split_of(family, name) == split
                     for factor in CHAIN_FACTORS)
    spec = FAMILIES[family]
    assert isinstance(spec, _Multiplication)
    reserved = {_mul_key(a, b) for a, b in EXAMPLE_PRODUCTS}
    out = []
    for a in range(spec.a_range[0], spec.a_range[1] + 1):
        for b in range(spec.b_range[0], spec.b_range[1] + 1):
            key = _mul_key(a, b)
            # no operand ending in 0 (a shortcut even a small model can take), no few-shot examples
            if a % 10 and b % 10 and key not in reserved and split_of(family, key) == split:
                out.append((a, b))
    return tuple(out)


def task_kind(family: str) -> str:
    """The kind of task a family's problems are (which prompt and tools an episode of it uses)."""
    return {"lookup": LOOKUP, "chain": CHAIN}.get(family, CALC)


def pool_size(split: str, family: str = DEFAULT_FAMILY) -> int:
    return len(_pool(family, split))


def _tasks(split: str, n: int, seed: int, family: str) -> list[Task]:
    pool = _pool(family, split)
    if n < 0 or n > len(pool):
        raise ValueError(f"{family} {split} has {len(pool)} problems; asked for {n}")
    rng = random.Random(f"rlproxy-demo|{family}|{split}|{seed}")
    picked = rng.sample(pool, n)
    if family == "lookup":
        return [_lookup_task(name, split) for (name,) in picked]
    if family == "chain":
        return [_chain_task(name, factor, split) for name, factor in picked]
    return [_mul_task(family, a, b, split) for a, b in picked]


def train_tasks(n: int, seed: int = 0, family: str = DEFAULT_FAMILY) -> list[Task]:
    """n distinct training problems (deterministic in n, seed, family)."""
    return _tasks("train", n, seed, family)


def heldout_tasks(n: int, seed: int = 0, family: str = DEFAULT_FAMILY) -> list[Task]:
    """n distinct held-out problems, none of which `train_tasks` or `gate_tasks` can ever return."""
    return _tasks("heldout", n, seed, family)


def gate_tasks(n: int, seed: int = 0, family: str = DEFAULT_FAMILY) -> list[Task]:
    """n distinct problems of the gate split: what the demo's gate decides on, never trained on and never
    counted in a held-out number."""
    return _tasks("gate", n, seed, family)


SPLITS = {"train": train_tasks, "gate": gate_tasks, "heldout": heldout_tasks}

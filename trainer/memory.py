"""Keep the trainer's resident memory near what its tensors need, under glibc's malloc (Linux; elsewhere a no-op).

A micro-batch allocates and frees hundreds of activation tensors whose sizes change with its length. glibc serves
blocks below its mmap threshold from its heaps, and raises that threshold (up to 32 MB) each time a larger block
is freed, so after the first micro-batch nearly every activation comes from a heap: freed space is reused only by
requests that fit in it, the heaps grow well past what is live, and what they hold is never given back. Steps
run on whichever thread the caller uses (the demo's event loop hands them to a thread pool), and each thread gets
heaps of its own. Measured on demo-shaped steps (bench/memory.py): the process held 4-6 GB after a few steps
whose tensors never needed more than 2.6 GB at once.

    tune_allocator()          # once, before the model loads
    release_free_memory()     # after each step
    with activation_checkpointing(model, micro_batch_too_long): ...   # the forward of one micro-batch

`tune_allocator` fixes the mmap threshold at 1 MB (mallopt M_MMAP_THRESHOLD; fixing it also stops it from
moving): larger blocks get pages of their own, returned to the system when freed. A lower threshold would track
live memory more closely but costs page faults: 128 KB made a step about 40% slower, 1 MB costs nothing we
could measure. `release_free_memory` (malloc_trim) hands back what the smaller blocks left free in every heap.

Activations are the other part, about 1.2 MB per token for the bundled model in float32: micro-batches are packed
to `micro_batch_tokens`, and one transition longer than that is computed with activation checkpointing.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    # musl and the BSDs have neither function; macOS's allocator returns memory by itself
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None
    return libc


def tune_allocator() -> bool:
    """Give blocks of MMAP_THRESHOLD_BYTES and more their own pages. True where glibc took the setting."""
    libc = _libc()
    if libc is None:
        return False
    ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused")
    return ok


def release_free_memory() -> None:
    """Return the free pages of every heap to the system."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@contextlib.contextmanager
def activation_checkpointing(model, on: bool) -> Iterator[None]:
    """With `on`, the forward passes inside keep only each decoder layer's input, and backward recomputes the rest
    layer by layer (one more forward pass): for a micro-batch over the token budget, whose activations would not
    fit it. Backward may run after the block; it uses what the forward recorded."""
    if not on:
        yield
        return
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        yield
    finally:
        model.gradient_checkpointing_disable()

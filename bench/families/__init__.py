"""Task families that differ from the demo in kind, for `bench/learning.py --family NAME`.

    lists     follow an output format (N lines starting with "- ", nothing else)
    extract   extract a person's name, age and city from a sentence into a JSON object
    tools     choose the one right tool of five for a request and reply with its name

Each is generated locally (nothing is downloaded), with disjoint train and held-out items (bench/families/base.py).
"""
from __future__ import annotations

from bench.families import extract, lists, tools
from bench.families.base import Family, Item

FAMILIES: dict[str, Family] = {family.name: family for family in (lists.FAMILY, extract.FAMILY, tools.FAMILY)}

__all__ = ["FAMILIES", "Family", "Item"]

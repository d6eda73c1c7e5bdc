"""Following an output format: "List N things of a category as N lines starting with '- ', nothing else".

What is learned is the format, not knowledge: the base model mostly answers with an introduction ("Sure! Here
are…"), a numbered list or a different number of lines. Held out are whole categories, never seen in training.
Success: exactly N non-empty lines, each "- " followed by one to four words, and nothing else.
"""
from __future__ import annotations

import re

from bench.families.base import Family, Item

CATEGORIES = (
    "fruits", "vegetables", "animals", "birds", "fish", "insects", "colors", "countries", "cities", "rivers",
    "mountains", "planets", "metals", "musical instruments", "sports", "board games", "card games", "flowers",
    "trees", "herbs", "spices", "cheeses", "breads", "desserts", "drinks", "kitchen tools", "garden tools",
    "hand tools", "vehicles", "boats", "aircraft", "fabrics", "gemstones", "dog breeds", "cat breeds",
    "farm animals", "sea creatures", "reptiles", "dinosaurs", "languages", "programming languages", "currencies",
    "shapes", "body parts", "clothing items", "shoes", "hats", "furniture", "rooms in a house", "school subjects",
    "jobs", "emotions", "weather events", "months", "days of the week", "seasons", "holidays", "dances",
    "painters", "composers", "scientists", "authors", "oceans", "deserts", "islands", "continents",
    "chemical elements", "computer parts", "office supplies", "toys", "nuts", "berries", "grains", "soups",
)
COUNTS = (2, 3, 4)
# Two worked examples as earlier turns (their categories are in neither split).
EXAMPLES = (
    {"role": "user", "content": 'List 3 colors of the rainbow. Write exactly 3 lines, each starting with "- " followed '
                                'by the name only, and nothing else.'},
    {"role": "assistant", "content": "- red\n- green\n- violet"},
    {"role": "user", "content": 'List 2 kinds of pasta. Write exactly 2 lines, each starting with "- " followed by the '
                                'name only, and nothing else.'},
    {"role": "assistant", "content": "- spaghetti\n- penne"},
)
LINE = re.compile(r"- \S+(?: \S+){0,3}")


def build() -> list[tuple[str, Item]]:
    items = []
    for category in CATEGORIES:
        for count in COUNTS:
            prompt = (f"List {count} {category}. Write exactly {count} lines, each starting with \"- \" followed "
                      f"by the name only, and nothing else.")
            items.append((category, Item(f"lists:{count}:{category}", (*EXAMPLES, {"role": "user", "content": prompt}), count)))
    return items


def score(item: Item, reply: str) -> float:
    lines = [line.rstrip() for line in reply.strip().splitlines()]
    return float(len(lines) == item.expected and all(LINE.fullmatch(line) for line in lines))


FAMILY = Family("lists", "follow an output format: N lines starting with '- ', nothing else", 48, build, score)

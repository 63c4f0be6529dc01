"""Answer normalisation, answer reading and the answer metrics (EM, subEM, token F1).

The default normalisation is Search-R1's ``normalize_answer`` (``verl/utils/reward_score/qa_em.py``),
which is the SQuAD v1.1 evaluation script's (Rajpurkar et al. 2016), character for character:

    normalize(s) = white_space_fix(remove_articles(remove_punc(lower(s))))

* ``lower``: ``str.lower``;
* ``remove_punc``: drop every character of ``string.punctuation`` (the 32 ASCII ones only);
* ``remove_articles``: ``re.sub(r"\\b(a|an|the)\\b", " ", s)`` (whole words, Unicode word boundaries);
* ``white_space_fix``: ``" ".join(s.split())`` (any Unicode white space).

So an answer with "—", "…", "«»" or curly quotes keeps those characters, exactly as the paper's
scorer keeps them, and a user's EM equals the paper's bit for bit. ``normalization="unicode"``
selects the variant that also drops every Unicode punctuation character (category P*).

The model's answer is read only from text the model generated: a trajectory gives its generated
token runs (``Trajectory.generated_spans``); a plain string is split around the text the environment
inserts (``<information>`` blocks and the invalid-action message) by ``model_spans``.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from searchr1.data.prompts import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    INVALID_ACTION_MESSAGE,
    THINK_CLOSE,
    THINK_OPEN,
)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCT = frozenset(string.punctuation)
_INFO_BLOCK = re.compile(re.escape(INFO_OPEN) + r".*?(?:" + re.escape(INFO_CLOSE) + r"|\Z)", flags=re.DOTALL)
_ENVIRONMENT_TEXT = re.compile(
    "(?:" + _INFO_BLOCK.pattern + "|" + re.escape(INVALID_ACTION_MESSAGE.strip()) + ")", flags=re.DOTALL
)
_THINK_BLOCK = re.compile(
    re.escape(THINK_OPEN) + r".*?(?:" + re.escape(THINK_CLOSE) + r"|\Z)", flags=re.DOTALL
)


# ---------------------------------------------------------------------------------------------
# normalisation
# ---------------------------------------------------------------------------------------------


def normalize_answer(s: str) -> str:
    """Search-R1's / SQuAD's normalisation: lower-case, drop ASCII punctuation, drop the articles
    a / an / the (as words), collapse white space (module docstring)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _ASCII_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def normalize_answer_unicode(s: str) -> str:
    """``normalize_answer`` that also drops every Unicode punctuation character (category P*:
    « » “ ” – — …); letters with accents are kept ("Röntgen" -> "röntgen"). Not the paper's scorer:
    select it with ``normalization="unicode"`` to compare."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _ASCII_PUNCT and not unicodedata.category(ch).startswith("P"))
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


NORMALIZATIONS: dict[str, Callable[[str], str]] = {
    "squad": normalize_answer,
    "unicode": normalize_answer_unicode,
}
"""Normalisation by name: ``squad`` (the default: Search-R1, SQuAD, FlashRAG) or ``unicode``."""


def normalizer(name: str) -> Callable[[str], str]:
    """The normalisation function called ``name`` (one-line error naming the known ones)."""
    try:
        return NORMALIZATIONS[name]
    except KeyError:
        raise ValueError(
            f"normalization: expected one of {', '.join(NORMALIZATIONS)}, got {name!r}"
        ) from None


# ---------------------------------------------------------------------------------------------
# the model's own text and its answer
# ---------------------------------------------------------------------------------------------


def strip_information(text: str) -> str:
    """``text`` without its ``<information>...</information>`` blocks (an unclosed block runs to the end)."""
    return _INFO_BLOCK.sub(" ", text)


def model_spans(text: str) -> list[str]:
    """The pieces of a response known only as text that the model wrote: the text between the
    environment's insertions (``<information>`` blocks, an unclosed one running to the end, and the
    invalid-action message). A fallback for text without token roles; a trajectory knows its own
    spans (``Trajectory.generated_spans``)."""
    return [piece for piece in _ENVIRONMENT_TEXT.split(text) if piece]


def answer_from_spans(spans: Sequence[str]) -> str | None:
    """The stripped content of the last complete ``<answer>...</answer>`` that lies inside one span
    of model text; ``None`` when no span holds one, ``""`` for an empty one.

    Within a span, the last ``<answer>`` that is closed later is taken, up to the first ``</answer>``
    after it. A tag pair never straddles two spans, so an answer cannot be assembled from text the
    environment cut apart.
    """
    for span in reversed(spans):
        start = span.rfind(ANSWER_OPEN)
        while start >= 0:
            end = span.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
            if end >= 0:
                return span[start + len(ANSWER_OPEN) : end].strip()
            start = span.rfind(ANSWER_OPEN, 0, start)
    return None


def extract_answer(response: str, prompt: str | None = None) -> str | None:
    """The answer of a response known only as text: ``answer_from_spans(model_spans(response))``.

    Retrieved ``<information>`` blocks and the invalid-action message are not the model's (a
    document quoting an answer tag, or the message's "between <answer> and </answer>", is never read);
    when ``prompt`` is given and ``response`` starts with it, it is cut off (the prompt's own
    ``<answer> Beijing </answer>`` example is never read).
    """
    if prompt and response.startswith(prompt):
        response = response[len(prompt) :]
    return answer_from_spans(model_spans(response))


def reply_text(spans: Sequence[str]) -> str:
    """The model's whole reply as an answer: its spans joined, ``<think>`` blocks removed, stripped
    (what the direct / cot / rag baselines score when the reply has no answer tag)."""
    return " ".join(_THINK_BLOCK.sub(" ", "".join(spans)).split())


def read_answer(spans: Sequence[str], fallback_to_reply: bool = False) -> tuple[str | None, str]:
    """``(answer, source)``: the answer tag if the model wrote one; else, with ``fallback_to_reply``,
    the reply itself (``reply_text``); else ``(None, "none")`` — no answer."""
    answer = answer_from_spans(spans)
    if answer is not None:
        return answer, "tag"
    if fallback_to_reply:
        return reply_text(spans), "reply"
    return None, "none"


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------


def _as_list(golden_answers: str | Iterable[str]) -> list[str]:
    if isinstance(golden_answers, str):
        return [golden_answers]
    return [str(g) for g in golden_answers]


def exact_match(
    prediction: str | None, golden_answers: str | Iterable[str], normalization: str = "squad"
) -> float:
    """EM = max over golden answers g of [normalize(prediction) == normalize(g)]; 0 without an
    answer. Search-R1's ``em_check`` (the paper's Table 2 metric)."""
    if prediction is None:
        return 0.0
    norm = normalizer(normalization)
    pred = norm(prediction)
    return float(any(pred == norm(g) for g in _as_list(golden_answers)))


def sub_exact_match(
    prediction: str | None, golden_answers: str | Iterable[str], normalization: str = "squad"
) -> float:
    """subEM = max over golden answers g of [normalize(g) is a substring of normalize(prediction)];
    0 without an answer. Search-R1's ``subem_check``, including its edge case: a golden answer that
    normalises to "" is contained in every prediction."""
    if prediction is None:
        return 0.0
    norm = normalizer(normalization)
    pred = norm(prediction)
    return float(any(norm(g) in pred for g in _as_list(golden_answers)))


def _token_f1(pred: str, gold: str, norm: Callable[[str], str]) -> float:
    pt, gt = norm(pred).split(), norm(gold).split()
    same = sum((Counter(pt) & Counter(gt)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pt), same / len(gt)
    return 2 * precision * recall / (precision + recall)


def f1_score(
    prediction: str | None, golden_answers: str | Iterable[str], normalization: str = "squad"
) -> float:
    """Token F1 of SQuAD v1.1 (Rajpurkar et al. 2016), maximised over golden answers:

        common = |tokens(p) ∩ tokens(g)| (multiset),  P = common / |tokens(p)|,  R = common / |tokens(g)|,
        F1 = 2PR / (P + R)   (0 when common = 0),

    tokens = ``normalize(.).split()``; 0 without an answer.
    """
    if prediction is None:
        return 0.0
    norm = normalizer(normalization)
    return max((_token_f1(prediction, g, norm) for g in _as_list(golden_answers)), default=0.0)


ANSWER_METRICS = {"em": exact_match, "subem": sub_exact_match, "f1": f1_score}
"""Answer metric by name (used by ``correct_answer`` and the evaluation)."""


def answer_scores(
    answer: str | None, golden_answers: Sequence[str], normalization: str = "squad"
) -> dict[str, float]:
    """``{"em", "sub_em", "f1"}`` of one answer against its golden answers (``None`` scores 0)."""
    return {
        "em": exact_match(answer, golden_answers, normalization),
        "sub_em": sub_exact_match(answer, golden_answers, normalization),
        "f1": f1_score(answer, golden_answers, normalization),
    }

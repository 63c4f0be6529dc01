"""The default answer metrics equal the paper's scorer bit for bit, on generated strings.

The reference below is written here from the definitions, not imported: SQuAD v1.1's
``normalize_answer`` (lower-case, drop ``string.punctuation``, drop the words a / an / the,
``" ".join(s.split())``, in that order), its token F1, and Search-R1's ``em_check`` /
``subem_check`` (``verl/utils/reward_score/qa_em.py``). The strings mix what makes normalisers
disagree: Unicode punctuation, articles in any case and position, accents, every kind of white
space, and empty strings.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from hypothesis import example, given, settings
from hypothesis import strategies as st

from searchr1.rewards import (
    exact_match,
    f1_score,
    normalize_answer,
    normalize_answer_unicode,
    sub_exact_match,
)

# --- the reference --------------------------------------------------------------------------------

_DROP_ASCII_PUNCT = str.maketrans("", "", string.punctuation)


def ref_normalize(text: str) -> str:
    lowered = text.lower()
    no_punct = lowered.translate(_DROP_ASCII_PUNCT)
    no_articles = re.sub(r"\b(a|an|the)\b", " ", no_punct)
    return " ".join(no_articles.split())


def ref_em(prediction: str, golds: list[str]) -> float:
    return 1.0 if any(ref_normalize(prediction) == ref_normalize(g) for g in golds) else 0.0


def ref_subem(prediction: str, golds: list[str]) -> float:
    return 1.0 if any(ref_normalize(g) in ref_normalize(prediction) for g in golds) else 0.0


def ref_f1(prediction: str, golds: list[str]) -> float:
    best = 0.0
    for g in golds:
        p_tokens, g_tokens = ref_normalize(prediction).split(), ref_normalize(g).split()
        overlap = sum((Counter(p_tokens) & Counter(g_tokens)).values())
        if overlap:
            precision, recall = overlap / len(p_tokens), overlap / len(g_tokens)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


# --- generated strings ------------------------------------------------------------------------------

PIECES = [
    *("a", "an", "the", "A", "An", "The", "THE", "aN", "anthem", "theatre", "Ana", "thee"),
    *("Paris", "Röntgen", "ÉCOLE", "Straße", "İstanbul", "ǅemal", "日本", "1901", "3.5"),
    *string.punctuation,
    *("—", "–", "…", "«", "»", "“", "”", "‘", "’", "„", "‹", "›", "¡", "¿", "·", "§", "¶", "、", "。", "‐"),
    *(" ", "  ", "\t", "\n", "\r", "\xa0", "\u2003", "\u3000", "\u200b", "\x1c", "\u2028"),
]
mixed = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
strings = st.one_of(mixed, st.text(max_size=20), st.just(""))


@settings(max_examples=600, deadline=None)
@given(strings)
@example("“Quoted” — text…")
@example("  The  ")
@example("")
def test_normalize_answer_equals_the_squad_definition(text):
    assert normalize_answer(text) == ref_normalize(text)


@settings(max_examples=600, deadline=None)
@given(strings, st.lists(strings, min_size=1, max_size=3))
@example("«Borvik»", ["Borvik"])
@example("anything", [""])
@example("", [""])
@example("the", ["a"])
def test_em_subem_f1_equal_the_reference(prediction, golds):
    assert exact_match(prediction, golds) == ref_em(prediction, golds)
    assert sub_exact_match(prediction, golds) == ref_subem(prediction, golds)
    assert f1_score(prediction, golds) == ref_f1(prediction, golds)  # same arithmetic: bit for bit


def test_the_unicode_variant_differs_exactly_on_unicode_punctuation():
    assert normalize_answer("«Borvik» — 1901…") == "«borvik» — 1901…"
    assert normalize_answer_unicode("«Borvik» — 1901…") == "borvik 1901"
    for text in ("Paris, France!", "The U.S.A.", "  an   apple "):  # ASCII only: both agree
        assert normalize_answer_unicode(text) == normalize_answer(text)

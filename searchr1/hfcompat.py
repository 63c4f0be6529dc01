"""One name for the key/value cache across transformers versions.

transformers 5.24 renamed the models' ``forward(past_key_values=...)`` argument, and the output field of the
same name, to ``cache``; ``past_key_values`` still works there with a ``FutureWarning`` and is removed in
5.40. Every place that runs a model on a cache passes ``**cache_arg(cache)`` and reads the new cache with
``output_cache(out)``, so the code runs without warnings on the versions before the rename and after it.

    out = model(input_ids=ids, **cache_arg(cache), use_cache=True)
    cache = output_cache(out)
"""

from __future__ import annotations

import inspect
from functools import cache as _memoized
from typing import Any


@_memoized
def cache_argument_name() -> str:
    """``"cache"`` when the installed transformers' models take it, else ``"past_key_values"``."""
    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


def cache_arg(cache: Any) -> dict[str, Any]:
    """The keyword argument that hands ``cache`` to a model's ``forward``."""
    return {cache_argument_name(): cache}


def output_cache(out: Any) -> Any:
    """The cache a model's ``forward`` returned (``out.cache`` or, before the rename, ``out.past_key_values``)."""
    return out["cache"] if cache_argument_name() == "cache" else out["past_key_values"]

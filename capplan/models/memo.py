"""Memoisation per model object, for functions a search calls thousands of times with the same
model (a frozen spec): the cache key is the model's id plus the other arguments, and each entry
keeps the model alive, so its id is not reused while the entry exists."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

T = TypeVar("T")
CACHE_MAX = 256
"""Entries per function; the cache is emptied when full (searches use a handful of keys)."""


def per_model(fn: Callable[..., T]) -> Callable[..., T]:
    """fn(model, *args) memoised on (id(model), *args); args must be hashable."""
    cache: dict[tuple, tuple[Any, T]] = {}

    @wraps(fn)
    def wrapper(model: Any, *args: Any) -> T:
        key = (id(model), *args)
        hit = cache.get(key)
        if hit is not None and hit[0] is model:
            return hit[1]
        if len(cache) >= CACHE_MAX:
            cache.clear()
        value = fn(model, *args)
        cache[key] = (model, value)
        return value

    return wrapper

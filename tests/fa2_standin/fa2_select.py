"""pytest plugin (``-p fa2_select``) that picks a reproducible part of FlashAttention-2's test grid, which
holds hundreds of thousands of parameter combinations.

--fa2-function NAME     keep the cases of test function NAME (repeatable; none given: all functions).
--fa2-where NAME=VALUE   keep the cases whose parameter NAME prints as VALUE (repeatable; a case lacking
                         NAME is kept); e.g. alibi=False for the features flashattn has.
--fa2-sample N           then keep N cases of each test function, drawn with --fa2-seed (0: all).
"""
import random


def pytest_addoption(parser):
    group = parser.getgroup("fa2_select")
    group.addoption("--fa2-function", action="append", default=[], metavar="NAME")
    group.addoption("--fa2-where", action="append", default=[], metavar="NAME=VALUE")
    group.addoption("--fa2-sample", type=int, default=0, metavar="N")
    group.addoption("--fa2-seed", type=int, default=0)


def _conditions(config):
    conditions = []
    for text in config.getoption("--fa2-where"):
        name, sep, value = text.partition("=")
        if not sep or not name:
            raise ValueError(f"fa2_select: --fa2-where takes NAME=VALUE, got {text!r}")
        conditions.append((name, value))
    return conditions


def _kept(item, conditions) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return all(str(params[name]) == value for name, value in conditions if name in params)


def pytest_collection_modifyitems(session, config, items):
    conditions = _conditions(config)
    sample = config.getoption("--fa2-sample")
    functions = set(config.getoption("--fa2-function"))
    kept = [item for item in items
            if (not functions or item.originalname in functions) and _kept(item, conditions)]
    if sample > 0:
        by_function = {}
        for item in kept:
            by_function.setdefault(item.originalname, []).append(item)
        rng = random.Random(config.getoption("--fa2-seed"))
        chosen = set()
        for group in by_function.values():
            chosen.update(id(item) for item in rng.sample(group, min(sample, len(group))))
        kept = [item for item in kept if id(item) in chosen]
    dropped = [item for item in items if item not in kept] if len(kept) != len(items) else []
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept

"""schemathesis 4.32 names each API operation's item `test_...[GET /v1/cluster]`, yet under
pytest 9 (which builds a function's node id from its original name and its callspec, and
schemathesis passes no callspec) they all get the node id of the bare function. pytest-xdist
schedules items by node id, so the suite's workers would run one operation of the 40 and drop
the rest without a word. Each item's node id gets its operation, as pytest's own parametrize
would give it. (`_id` is pytest's; there is no public way to set a node id after the fact.)"""

from __future__ import annotations

import pytest

HERE = __file__.rsplit("/", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not str(item.path).startswith(HERE) or "[" not in item.name:
            continue
        if isinstance(item, pytest.Function) and not item.nodeid.endswith("]"):
            operation = item.name.removeprefix(item.originalname)[1:-1]
            assert item.parent is not None
            item._id = item.parent.id.child(item.originalname).with_params(operation)

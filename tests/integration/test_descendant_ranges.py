"""A lock meets the locks inside it whatever their characters, on every backend.

The conflict check found a path's descendants with ``LIKE 'path/%'``.
MariaDB's index range for that pattern, under the tables' binary collation,
ends below four-byte characters (emoji, most CJK extensions): a lock on
``/a/😀/😀`` did not block ``/a/😀``, and two conflicting leases were both
granted. Descendants are now an explicit range of the index.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from pathlock import PathLockManager

# Characters right after a folder's slash, from the smallest allowed to the
# largest code point, with four-byte ones among them.
CHILDREN = [
    " ",
    "-",
    "0",
    "~",
    "\u00e9",
    "\ue000",
    "\uffff",
    "\U0001f600",
    "\U00020000",
    "\U0010ffff",
]


# One holder, prober and crowded customer per backend for the whole module:
# the 400 locks took a second to take on each of the 60 tests. Every test
# releases what it takes.


@pytest.fixture(scope="module")
def holder(database_url: str) -> Iterator[PathLockManager]:
    with PathLockManager(database_url, node_id=f"ranges-{secrets.token_hex(4)}") as manager:
        yield manager


@pytest.fixture(scope="module")
def prober(database_url: str) -> Iterator[PathLockManager]:
    with PathLockManager(database_url, node_id=f"probe-{secrets.token_hex(4)}") as manager:
        yield manager


@pytest.fixture(scope="module")
def crowded(holder: PathLockManager) -> Iterator[int]:
    """A customer holding many other locks: with a handful of rows the
    server may read them all instead of the index range (and the old query
    passed); with these it uses the range, as it does in production."""
    customer_id = secrets.randbelow(2**62) + 1
    lease = holder.for_customer(customer_id).lock_paths(*(f"/zz/{n}" for n in range(400)))
    yield customer_id
    lease.release()


@pytest.mark.parametrize("child", CHILDREN, ids=lambda child: f"U+{ord(child):04X}")
@pytest.mark.parametrize("folder", ["/a", "/a/\U0001f600"], ids=["ascii", "emoji"])
def test_a_lock_inside_a_folder_blocks_the_folder(
    holder: PathLockManager, prober: PathLockManager, crowded: int, folder: str, child: str
) -> None:
    customer_id = crowded
    inside = folder + "/" + child + "/x" + child
    lease = holder.for_customer(customer_id).lock_paths(inside, timeout=0)
    other = prober.for_customer(customer_id)
    assert other.try_lock_paths(folder) is None
    assert other.try_lock_paths(shared=[folder]) is None
    lease.release()
    lease = holder.for_customer(customer_id).lock_paths(shared=[inside], timeout=0)
    assert other.try_lock_paths(folder) is None
    both = other.try_lock_paths(shared=[folder])
    assert both is not None
    both.release()
    lease.release()


@pytest.mark.parametrize("child", CHILDREN, ids=lambda child: f"U+{ord(child):04X}")
def test_a_neighbour_that_only_shares_a_prefix_is_not_blocked(
    holder: PathLockManager, prober: PathLockManager, crowded: int, child: str
) -> None:
    customer_id = crowded
    lease = holder.for_customer(customer_id).lock_paths("/a/b", timeout=0)
    neighbour = prober.for_customer(customer_id).try_lock_paths("/a" + child, "/a/b" + child)
    assert neighbour is not None
    neighbour.release()
    lease.release()

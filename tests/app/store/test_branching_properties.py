"""Whatever sequence of sends, edits, regenerations and switches: the tree stays consistent."""

import tempfile
from itertools import pairwise
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagoda.app.store import ConversationStore

ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["send", "reply", "edit", "regenerate", "switch"]), st.integers(0, 99)
    ),
    min_size=1,
    max_size=25,
)


def apply(store: ConversationStore, cid: int, action: str, pick: int) -> None:
    messages = store.messages(cid)
    users = [m for m in messages if m.role == "user"]
    replies = [m for m in messages if m.role == "assistant"]
    if action == "send":
        store.append_user_message(cid, f"question {pick}")
    elif action == "reply":
        reply = store.start_assistant_message(cid)
        store.finish_message(reply.id, f"answer {pick}", "stop")
    elif action == "edit" and users:
        store.edit_user_message(users[pick % len(users)].id, f"edited {pick}")
    elif action == "regenerate" and replies:
        again = store.regenerate(replies[pick % len(replies)].id)
        store.interrupt_message(again.id, f"again {pick}")
    elif action == "switch" and messages:
        store.switch_branch(messages[pick % len(messages)].id)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS)
def test_path_runs_from_a_root_to_a_childless_leaf_and_nothing_is_lost(actions) -> None:
    with (
        tempfile.TemporaryDirectory() as folder,
        ConversationStore.open(Path(folder) / "p.db") as store,
    ):
        cid = store.create_conversation().id
        created = 0
        for action, pick in actions:
            before = len(store.messages(cid))
            apply(store, cid, action, pick)
            created += len(store.messages(cid)) - before
            assert_consistent(store, cid)
        assert len(store.messages(cid)) == created


def assert_consistent(store: ConversationStore, cid: int) -> None:
    path = store.current_path(cid)
    leaf_id = store.get_conversation(cid).leaf_id
    if not path:
        assert leaf_id is None
        return
    assert path[0].parent_id is None
    assert all(child.parent_id == parent.id for parent, child in pairwise(path))
    assert path[-1].id == leaf_id
    assert not any(m.parent_id == leaf_id for m in store.messages(cid))

"""A slot's prefix kept in host RAM brings the head's cache back with the target's: a chat's next turn,
its history restored after another request took the slot, drafts exactly as if it had never left."""

import pytest

from ollama_spec.engine.engine import Engine
from ollama_spec.engine.sinks import stream
from tests.builders.eagle3_heads import build_heads
from tests.conftest import engine_settings
from tests.engine.test_eagle3_engine import request

HISTORY = " ".join(f"step {i}: add {i} to the total;" for i in range(12))  # over the 64 tokens worth saving


@pytest.fixture(scope="module")
def heads(tiny_models, tmp_path_factory):
    return build_heads(tiny_models[0].path, tmp_path_factory.mktemp("heads"))


def run(engine, tokens, k=2, max_tokens=24):
    ticket, pieces = stream(engine.loop, request("", k, max_tokens=max_tokens), tokens)
    "".join(pieces)
    return ticket.generation.result


def next_turn(engine, between: bool):
    """The history's answer, then (after another request in the slot when `between`) the next turn:
    its result and the head's drafts in it (each draft step's best token)."""
    history = engine.prompt_tokens(request(HISTORY))
    first = run(engine, history)
    if between:
        run(engine, engine.prompt_tokens(request("Something else entirely, and longer than that")))
    drafts, decode_many = [], engine.head.decode_many
    engine.head.decode_many = lambda items: [drafts.append(int(row.argmax())) or row for row in decode_many(items)]
    follow = [*history, *first.tokens, *engine.prompt_tokens(request(" and then"))[1:]]
    return run(engine, follow, max_tokens=32), drafts


@pytest.mark.parametrize("kind", ["random", "crafted"])
def test_a_restored_prefix_drafts_as_before_it_was_saved(kind, heads, tiny_models):
    """The random head's drafts read its cache's g rows (a cache refilled without them drafts other
    tokens); the crafted head's acceptance is the same as without the save."""
    with Engine(tiny_models[0], None, engine_settings(head=heads[kind])) as kept:
        expected, expected_drafts = next_turn(kept, between=False)
        assert kept.pool.restored_tokens == 0
    with Engine(tiny_models[0], None, engine_settings(head=heads[kind])) as saved:
        got, drafts = next_turn(saved, between=True)
        assert saved.pool.restored_tokens > 64
    assert got.tokens == expected.tokens
    assert drafts == expected_drafts and len(drafts) > 20
    assert (got.speculation.drafted, got.speculation.accepted) == (
        expected.speculation.drafted,
        expected.speculation.accepted,
    )

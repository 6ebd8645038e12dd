"""A chat's next turn extends the cached tokens exactly: each turn evaluates only its new tokens."""

import pytest

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.conversation import Conversation
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.prompting.messages import ChatMessage
from tests.conftest import engine_settings


@pytest.fixture
def engine(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        yield engine


def counting(monkeypatch, model):
    """Record the size of every batch `model` evaluates in the step loop's passes (the real evaluation
    still runs)."""
    batches = []
    real = model.decode_many

    def decode_many(items):
        batches.extend(len(tokens) for _, tokens, _ in items)
        return real(items)

    monkeypatch.setattr(model, "decode_many", decode_many)
    return batches


def say(conversation, text):
    generation = conversation.ask(text)
    answer = "".join(generation)
    return answer, conversation.finish(generation)


def defaults(**kwargs):
    return Request(
        system="", max_tokens=30, sampling=SamplingSettings(temperature=0), speculation=SpeculationSettings(3), **kwargs
    )


def test_each_turn_evaluates_only_its_new_tokens(engine, monkeypatch):
    conversation = Conversation(engine, defaults(), system="Be brief.")
    _, first = say(conversation, "Hello there")
    assert first.speculation.prompt_cached == 0
    held = first.prompt_tokens + len(first.tokens)  # the first prompt and the answer, as generated

    target_batches, draft_batches = counting(monkeypatch, engine.target), counting(monkeypatch, engine.draft)
    _, second = say(conversation, "What did I say?")
    new = second.prompt_tokens - second.speculation.prompt_cached
    # The new turn is the template's end of the answer, the user's turn and the assistant's cue.
    suffix = engine.chat_text(
        [
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "Hello there"),
            ChatMessage("assistant", "\x00"),
            ChatMessage("user", "What did I say?"),
        ]
    )
    suffix_tokens = engine.target.tokenize(suffix.partition("\x00")[2], add_bos=False, special=True)
    assert second.prompt_tokens == held + len(suffix_tokens)
    assert second.speculation.prompt_cached >= held - 1  # the last answer token may not have been evaluated yet
    assert new <= len(suffix_tokens) + 1
    assert target_batches[0] == new  # the prompt batch: the new tokens, the last one's row giving the first token
    # The draft reads only the new tokens too, and the first token of the answer (the prompt's pass gave it).
    assert draft_batches[0] <= new + 2


def test_a_rerendered_answer_would_be_read_again(engine):
    """Why the exact history matters: the answer's text tokenizes differently from the generated tokens."""
    conversation = Conversation(engine, defaults())
    answer, first = say(conversation, "Hello there")
    rendered = engine.prompt_tokens(
        defaults(
            messages=(
                ChatMessage("user", "Hello there"),
                ChatMessage("assistant", answer),
                ChatMessage("user", "What did I say?"),
            )
        )
    )
    exact = conversation._extended(conversation._conversation() + [ChatMessage("user", "What did I say?")])
    assert exact[: first.prompt_tokens + len(first.tokens)] != rendered[: first.prompt_tokens + len(first.tokens)]


def test_reset_and_system_start_a_fresh_prompt(engine):
    conversation = Conversation(engine, defaults(), history=(ChatMessage("user", "Hi"), ChatMessage("assistant", "Yo")))
    say(conversation, "one")
    assert [m.role for m in conversation.messages] == ["user", "assistant", "user", "assistant"]
    conversation.reset()
    assert conversation.messages == [ChatMessage("user", "Hi"), ChatMessage("assistant", "Yo")]
    conversation.set_system("Speak like a pirate.")
    _, result = say(conversation, "two")
    text = engine.target.detokenize(
        engine.prompt_tokens(
            defaults(messages=(ChatMessage("system", "Speak like a pirate."), *conversation.messages[:-1]))
        )
    )
    assert "Speak like a pirate." in text and result.prompt_tokens > 10


def test_an_interrupted_answer_is_kept_and_the_next_turn_works(engine):
    conversation = Conversation(engine, defaults())
    generation = conversation.ask("Hello there")
    pieces = iter(generation)
    next(pieces)
    pieces.close()  # what Ctrl-C does
    partial = conversation.finish(generation)
    assert 0 < len(partial.tokens) < 30 and conversation.messages[-1].role == "assistant"
    _, second = say(conversation, "Go on")
    assert second.tokens and second.speculation.prompt_cached > 0


def test_a_template_that_rewrites_history_falls_back_to_rendering_it_all(tiny_models):
    import dataclasses

    # Renders only the latest user turn, as templates that drop earlier reasoning rewrite history.
    template = "{{ bos_token }}{{ messages[-1]['content'] }}<|eot_id|>"
    target = dataclasses.replace(tiny_models[0], info=dataclasses.replace(tiny_models[0].info, chat_template=template))
    with Engine(target, tiny_models[1], engine_settings()) as engine:
        conversation = Conversation(engine, defaults())
        say(conversation, "Hello there")
        assert conversation._extended(conversation._conversation() + [ChatMessage("user", "Next")]) is None
        _, second = say(conversation, "Next")
        assert second.tokens and second.prompt_tokens == len(
            engine.prompt_tokens(defaults(messages=(ChatMessage("user", "Next"),)))
        )

"""`ollama-spec chat`: a script of turns on standard input, and a real terminal (a pseudo-terminal)."""

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

ARGS = ("tiny-target", "-d", "tiny-draft", "-t", "0", "-n", "20", "-k", "3", "--threads", "1", "--no-check")


def test_piped_stdin_is_a_script_of_turns(invoke, tiny_store):
    script = "Hello there\nWhat did I say?\n/stats\n/bogus\n/reset\n/system Be terse.\nAgain\n/exit\nnever read\n"
    result = invoke("chat", *ARGS, "--models-dir", tiny_store, input=script)
    assert result.exit_code == 0, result.output
    answers = result.stdout.splitlines()
    assert len(answers) == 3 and all(a.strip() for a in answers)
    stats = result.stderr
    assert "tokens per target pass" in stats and "kept in the cache" in stats
    evaluated, kept = [int(w) for w in stats.split("prompt: ")[1].split() if w.isdigit()][:2]
    assert kept > evaluated > 0  # the second turn read only its new tokens
    assert "unknown command /bogus; /help lists them" in stats and "conversation reset" in stats
    assert "system prompt set" in stats


def test_ollama_runs_spellings_of_the_commands(invoke, tiny_store):
    result = invoke("chat", *ARGS, "--models-dir", tiny_store, input="Hi\n/clear\n/set system Be terse.\n/bye\n")
    assert result.exit_code == 0, result.output
    assert "conversation reset" in result.stderr and "system prompt set" in result.stderr
    usage = invoke("chat", *ARGS, "--models-dir", tiny_store, input="/set system\n/set parameter seed 1\n/bye\n")
    assert usage.stderr.count("usage: /set system TEXT") == 2 and "system prompt cleared" not in usage.stderr


def test_a_message_of_several_lines_between_triple_quotes_is_one_turn(invoke, tiny_store):
    from ollama_spec.cli.chat import _joined

    assert list(_joined(['"""first\n', "second\n", 'third"""\n', "after\n"])) == ["first\nsecond\nthird", "after\n"]
    assert list(_joined(['"""one line"""\n'])) == ["one line"]
    assert list(_joined(['"""never closed\n', "x\n"])) == ["never closed\nx"]  # the input ended: sent as it is
    result = invoke("chat", *ARGS, "--models-dir", tiny_store, input='"""Hello\nthere,\nfriend"""\n/bye\n')
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 1  # one answer, not three


def test_same_answers_as_generate_for_the_first_turn(invoke, tiny_store):
    chat = invoke("chat", *ARGS, "--models-dir", tiny_store, input="Hello there\n")
    once = invoke("generate", *ARGS, "Hello there", "--models-dir", tiny_store)
    assert chat.stdout == once.stdout + "\n" or chat.stdout == once.stdout


def test_a_full_context_says_so_and_offers_reset(invoke, tiny_store):
    long_turn = "word " * 200
    result = invoke("chat", *ARGS, "--ctx", "64", "--models-dir", tiny_store, input=f"Hi\n{long_turn}\n/reset\nHi\n")
    assert result.exit_code == 0, result.output
    assert re.search(r"the context is full \(\d+ tokens\): /reset to start over", result.stderr)
    # the first message alone too long: /reset cannot help, so it is not offered
    alone = invoke("chat", *ARGS, "--ctx", "64", "--models-dir", tiny_store, input=f"{long_turn}\n")
    assert re.search(r"this message makes a prompt of \d+ tokens, more than the context \(64\)", alone.stderr)
    assert "/reset" not in alone.stderr


def _read_until(fd, marker: bytes, timeout: float = 60, *, required: bool = True) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        if left <= 0 and not required:
            break
        assert left > 0, f"no {marker!r} in {seen[-400:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_a_terminal_session_with_ctrl_c_and_ctrl_d(tiny_store, tmp_path):
    controller, terminal = pty.openpty()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from ollama_spec.cli import main; main()",
            "chat",
            *ARGS,
            "--models-dir",
            str(tiny_store),
        ],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        close_fds=True,
        start_new_session=True,
        env={**os.environ, "TERM": "dumb"},
        # A run started in the background inherits an ignored SIGINT, and Python then keeps ignoring it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(terminal)
    try:
        assert b"/help for commands" in _read_until(controller, b">>> ")
        os.write(controller, b"Hello there\n")
        assert len(_read_until(controller, b">>> ").strip()) > len(b"Hello there")
        os.write(controller, b"half a line")
        _read_until(controller, b"half a line")
        # Ctrl-C at the prompt: a new prompt, not an exit. A signal that lands while readline is between
        # reading a key and waiting for the next is only seen at the next key, so it is sent until seen.
        for _ in range(5):
            time.sleep(0.3)
            os.killpg(child.pid, signal.SIGINT)
            seen = _read_until(controller, b">>> ", 5, required=False)
            if b"^C" in seen:
                break
        assert b"^C" in seen and child.poll() is None
        os.write(controller, b"/stats\n")
        assert b"kept in the cache" in _read_until(controller, b">>> ")
        os.write(controller, b"\x04")  # Ctrl-D quits
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(controller)


def test_ctrl_c_mid_answer_stops_it_and_the_next_turn_goes_on(tiny_models, monkeypatch, capsys):
    """The interrupt lands where a real one does, inside llama.cpp's evaluation of a verify batch."""
    from ollama_spec.cli.chat import _answer
    from ollama_spec.decoding.sampling import SamplingSettings
    from ollama_spec.engine.conversation import Conversation
    from ollama_spec.engine.engine import Engine, Request
    from tests.conftest import engine_settings

    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        conversation = Conversation(engine, Request(max_tokens=200, sampling=SamplingSettings(temperature=0)))
        real_decode, calls = engine.target.decode_many, []

        def decode_then_ctrl_c(items):  # the step loop's target passes
            calls.append(len(items))
            if len(calls) == 4:  # the prompt, then a few steps of the answer
                raise KeyboardInterrupt
            return real_decode(items)

        monkeypatch.setattr(engine.target, "decode_many", decode_then_ctrl_c)
        _answer(conversation, "Tell me a long story", interactive=True)
        stopped = conversation.last
        assert "(stopped)" in capsys.readouterr().err
        assert 0 < len(stopped.tokens) < 200 and len(conversation.messages) == 2  # the partial answer is kept
        assert stopped.finish_reason == "stopped"  # /stats says Ctrl-C ended it, not the context
        monkeypatch.setattr(engine.target, "decode_many", real_decode)
        _answer(conversation, "And then?", interactive=True)  # the chat goes on from a consistent cache
        assert len(conversation.messages) == 4 and conversation.last.tokens
        assert conversation.last.speculation.prompt_cached > 0  # the first turn was not read again


def test_format_keeps_every_answer_to_the_schema(invoke, tiny_store):
    import json

    schema = {"type": "object", "required": ["yes"], "properties": {"yes": {"type": "boolean"}}}
    result = invoke(
        "chat",
        *ARGS,
        "-n",
        "40",
        "--format",
        json.dumps(schema),
        "--models-dir",
        tiny_store,
        input="Hello there\nAnd again?\n",
    )
    assert result.exit_code == 0, result.output
    answers = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert len(answers) == 2 and all(set(a) == {"yes"} for a in answers)

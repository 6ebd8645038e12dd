"""`ollama-spec chat`: an interactive conversation with the pair, kept in both KV caches between turns."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import click

from ollama_spec.cli.common import notice
from ollama_spec.cli.flags import RunFlags, into
from ollama_spec.cli.options import (
    ctx_option,
    format_option,
    loading_options,
    models_dir_option,
    preset_option,
    sampling_options,
    show_draft_option,
    speculation_options,
    think_option,
    verbose_option,
)
from ollama_spec.cli.results import format_stats
from ollama_spec.cli.settings import Options, engine_settings, first_set, request_settings
from ollama_spec.cli.show_draft import colour_on, legend, printed
from ollama_spec.cli.targets import apply_preset, check_draft_flags, drafter_name, resolve_draft
from ollama_spec.config import cache_dir
from ollama_spec.engine.conversation import Conversation
from ollama_spec.engine.engine import DEFAULT_MAX_TOKENS, Engine
from ollama_spec.llama.log import set_verbose
from ollama_spec.models.resolve import resolve_model, template_warning

PROMPT = ">>> "
HELP = """commands:
  /stats         speed and acceptance of the last answer, and the prompt tokens it evaluated
  /reset         start the conversation over (the system prompt stays; Ollama's /clear too)
  /system TEXT   set the system prompt (/system alone clears it; Ollama's /set system TEXT too)
  /exit, /bye    quit (or Ctrl-D); Ctrl-C stops an answer
  \"\"\"           begins a message of several lines; a line ending with \"\"\" ends it"""
HISTORY_LINES = 1000


@dataclass(frozen=True)
class ChatFlags(RunFlags):
    max_tokens: int | None
    system: str | None
    output_format: str | None
    think: bool | None
    show_draft: bool


@click.command()
@click.argument("target")
@preset_option
@speculation_options
@sampling_options
@click.option(
    "--max-tokens", "-n", type=int, help=f"Most tokens per answer (default: num_predict, else {DEFAULT_MAX_TOKENS})."
)
@ctx_option
@click.option("--system", help="System prompt (default: the preset's SYSTEM, else the model's system layer).")
@format_option
@think_option
@loading_options
@show_draft_option
@verbose_option
@models_dir_option
@click.pass_context
@into(ChatFlags)
def chat(context: click.Context, flags: ChatFlags) -> None:
    """Chat with TARGET, drafted by --draft, in the model's chat template.

    Answers stream as they are accepted. The conversation stays in both models' KV caches, and
    each turn evaluates only its new tokens. Type /help for the commands. With standard input
    piped, each line is one turn (or one command).

    \b
    Examples:
      ollama-spec chat llama3.1:70b --draft llama3.2:1b
      ollama-spec chat -f llama3.3-70b
      printf 'Hi!\\nWhat did I just say?\\n/stats\\n' | ollama-spec chat llama3.1:8b -d llama3.2:1b -t 0
      ollama-spec chat llama3.1:8b -d llama3.2:1b --show-draft   # drafted text in green
      ollama-spec chat glm-4.5-air -d mtp   # the target's own MTP (NextN) layers
    """
    set_verbose(flags.verbose)
    # the shared options go to the settings with where each came from (the command line, a -f preset, the
    # default): the rule that picks between them needs both
    options = Options.of(context)
    target_model = apply_preset(resolve_model(flags.target, flags.models_dir), flags.preset)
    if warning := template_warning(target_model, "`generate --raw` continues plain text"):
        click.echo(f"warning: {warning}", err=True)
    choice = resolve_draft(flags.draft, flags.models_dir, target_model)
    draft_model, settings = choice.model, engine_settings(target_model.params, options, choice)
    defaults = request_settings(target_model, options, system="")  # the conversation carries its own system message
    interactive = sys.stdin.isatty()
    speculative = draft_model is not None or choice.source is not None
    check_draft_flags(show_draft=flags.show_draft, ngram=options["with_ngram"], choice=choice)
    colour = flags.show_draft and colour_on()
    with Engine(target_model, draft_model, settings, notice=notice) as engine:
        system = first_set(flags.system, target_model.system)
        conversation = Conversation(engine, defaults, system, target_model.messages)
        if interactive:
            drafter = drafter_name(choice, engine.settings)
            click.echo(
                f"{target_model.name}"
                + (f" drafted by {drafter}" if drafter else "")
                + f"; {engine.target.n_ctx} tokens of context. /help for commands, Ctrl-D quits.",
                err=True,
            )
        if flags.show_draft:
            click.echo(legend(colour), err=True)
        for line in _joined(_lines(interactive)):
            if not _turn(conversation, line.strip(), interactive, speculative=speculative, colour=colour):
                break


MULTILINE = '"""'


def _joined(lines):
    """Lines as turns: a line opening with \"\"\" starts a message of several lines that a line ending
    with \"\"\" closes, as in `ollama run` (pasted code, a letter)."""
    lines = iter(lines)
    for line in lines:
        text = line.strip()
        if not text.startswith(MULTILINE):
            yield line
            continue
        parts = [text[len(MULTILINE) :]]
        while not (parts[-1].endswith(MULTILINE) and (len(parts) > 1 or len(text) >= 2 * len(MULTILINE))):
            following = next(lines, None)
            if following is None:  # the input ended inside the message: send what there is
                parts[-1] += MULTILINE
                break
            parts.append(following.rstrip("\n"))
        parts[-1] = parts[-1][: -len(MULTILINE)]
        yield "\n".join(parts)


def _lines(interactive: bool):
    """The user's lines: read with readline's editing and history on a terminal, else standard input's."""
    if not interactive:
        yield from sys.stdin
        return
    history = _start_history()
    try:
        while True:
            try:
                yield input(PROMPT)
            except KeyboardInterrupt:  # Ctrl-C at the prompt clears the line, as in a shell
                click.echo("^C", err=True)
            except EOFError:  # Ctrl-D
                click.echo(err=True)
                return
    finally:
        history()


def _start_history():
    """Load readline's history; return the function that saves it. Without readline: plain input()."""
    try:
        import readline
    except ImportError:  # Windows: no line editing beyond the console's own
        return lambda: None
    path = cache_dir() / "chat_history"
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(HISTORY_LINES)

    def save() -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
        except OSError:
            pass

    return save


def _turn(conversation: Conversation, line: str, interactive: bool, *, speculative: bool, colour: bool = False) -> bool:
    """Run one line: a command or a user turn. False to quit."""
    if not line:
        return True
    command, _, argument = line.partition(" ")
    if command == "/set":  # `ollama run`'s spelling of /system; its other settings are flags here
        what, _, text = argument.strip().partition(" ")
        if what != "system" or not text.strip():
            click.echo("usage: /set system TEXT (other settings are command-line flags here: see --help)", err=True)
            return True
        command, argument = "/system", text
    if command in ("/exit", "/bye", "/quit"):
        return False
    if command in ("/help", "/?"):
        click.echo(HELP, err=True)
    elif command in ("/reset", "/clear"):  # /clear: `ollama run`'s
        conversation.reset()
        click.echo("conversation reset", err=True)
    elif command == "/system":
        conversation.set_system(argument.strip())
        click.echo("system prompt " + ("set" if argument.strip() else "cleared"), err=True)
    elif command == "/stats":
        click.echo(_stats(conversation, speculative), err=True)
    elif line.startswith("/") and " " not in command[1:] and command[1:].isalpha():
        click.echo(f"unknown command {command}; /help lists them", err=True)
    else:
        _answer(conversation, line, interactive, colour)
    return True


def _answer(conversation: Conversation, text: str, interactive: bool, colour: bool = False) -> None:
    n_ctx = conversation.engine.target.n_ctx
    if (length := conversation.prompt_length(text)) >= n_ctx:
        if not conversation.messages:  # nothing earlier to forget: /reset cannot help
            click.echo(
                f"this message makes a prompt of {length} tokens, more than the context ({n_ctx}): shorten "
                "it, or restart with a larger --ctx",
                err=True,
            )
        else:
            click.echo(
                f"the context is full ({n_ctx} tokens): /reset to start over, or restart with a larger --ctx", err=True
            )
        return
    generation = conversation.ask(text)
    pieces = printed(generation, colour)
    stopped = False
    try:
        for piece in pieces:
            click.echo(piece, nl=False)
            sys.stdout.flush()
    except KeyboardInterrupt:
        if not interactive:
            raise
        stopped = True
        pieces.close()  # ends the loop cleanly: the caches keep what was accepted
        click.echo("\n(stopped)", err=True, nl=False)
    finally:
        result = conversation.finish(generation)
        if stopped:
            result.finish_reason = "stopped"  # for /stats: Ctrl-C, not the context, ended it
    click.echo()
    sys.stdout.flush()
    if result.finish_reason == "context" and not stopped:
        click.echo(f"the context is full ({n_ctx} tokens): /reset to start over", err=True)


def _stats(conversation: Conversation, speculative: bool) -> str:
    result = conversation.last
    if result is None:
        return "no answer yet"
    evaluated = result.prompt_tokens - result.speculation.prompt_cached
    return (
        format_stats(result, speculative=speculative)
        + f"\nprompt: {evaluated} new tokens evaluated, {result.speculation.prompt_cached} kept in the cache"
    )

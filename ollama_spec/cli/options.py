"""The options several commands share, declared once; `settings` maps what they parse onto the core's settings.

A stack whose help names a core default (`sampling_options`: the default temperature) imports it when
a command is declared with it, not when this module is imported: `list` and `show` take only the
light declarations here and so never load numpy's, llama.cpp's or the server's modules.
"""

from __future__ import annotations

import click

from ollama_spec.planning.placement import SPLIT_MODES

RPC_ENVVAR = "OLLAMA_SPEC_RPC"
# What a command that runs (or plans) a pair does when --draft is not given: `targets.resolve_draft`.
WITHOUT_DRAFT = (
    "Without it: the draft the target's manifest carries (Ollama's DRAFT layer), else the target's own MTP "
    "(NextN) layers where it has them (-k auto drafts with them only while they pay), else the target alone."
)


def _stack(*decorators):
    def apply(function):
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


def models_dir_option_with(help_text: str):
    """--models-dir with a command's own account of which store it means."""
    return click.option("--models-dir", type=click.Path(file_okay=False), default=None, help=help_text)


models_dir_option = models_dir_option_with(
    "Ollama model store to read (default: $OLLAMA_MODELS, then ~/.ollama/models, then /usr/share/ollama/.ollama/models)."
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
verbose_option = click.option("--verbose", is_flag=True, help="Show llama.cpp's own log.")
no_check_option = click.option(
    "--no-check", "--force", "no_check", is_flag=True, help="Skip the memory check before loading."
)
threads_option = click.option("--threads", type=int, help="CPU threads (default: all cores).")


def parallel_option_with(help_text: str, default: int | None = None):
    """--parallel N: slots, requests that run together, each its own n_ctx tokens in both caches."""
    return click.option(
        "--parallel",
        type=click.IntRange(min=1),
        default=default,
        envvar="OLLAMA_NUM_PARALLEL",
        help=help_text + " [env: OLLAMA_NUM_PARALLEL]",
    )


repack_option = click.option(
    "--repack/--no-repack",
    default=None,
    help="Use llama.cpp's repacked copy of CPU weights (AMX, AVX2, Arm kernels) or not "
    "(default: $OLLAMA_SPEC_REPACK, else on where a one-time test run on this machine passed).",
)

flash_attn_option = click.option(
    "--flash-attn",
    "flash_attn",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="llama.cpp's flash attention. auto: on the CPU, off for one slot (small verify batches are faster "
    "without it deep into a context); with several slots both kinds are timed at the first load, and it "
    "is off where it is 10 % slower (cached); llama.cpp's choice on a GPU.",
)


def ctx_option_with(help_text: str):
    """--ctx with a command's own account of its default."""
    return click.option("--ctx", type=int, help=help_text)


def ctx_option(function):
    """--ctx, defaulting to the model's num_ctx."""
    from ollama_spec.engine.engine import DEFAULT_CTX

    return ctx_option_with(f"Context length in tokens (default: the model's num_ctx, else {DEFAULT_CTX}).")(function)


def kv_type_option(function):
    from ollama_spec.planning.kv_cache import KV_TYPES

    return click.option(
        "--kv-type",
        type=click.Choice(list(KV_TYPES)),
        default="f16",
        show_default=True,
        help="KV cache element type (q8_0 halves the cache; quantized caches use flash attention).",
    )(function)


class DraftOption(click.Option):
    """The one --draft: `draft_option` makes every command's, so tests can find them all by class."""


def draft_option(
    tail: str = "",
    *,
    names: str = "",
    auto: bool = True,
    ngram: bool = True,
    mtp: bool = True,
    required: bool = False,
):
    """--draft (-d): the same name, short flag and account of its values in every command that takes a
    draft; a command says which names it resolves, which of `auto`/`ngram`/`mtp` it accepts, and what it
    does with the draft (or without one) in `tail`. The names of `auto` and the draftless sources come from
    decoding/proposer_table, imported only by a command that lists them."""
    what = f"small, same vocabulary as the target: {names}" if names else "small, same vocabulary as the target"
    values = []
    if auto or ngram or mtp:
        from ollama_spec.decoding.proposer_table import AUTO, MTP, NGRAM

        values = [f"'{AUTO}' for the store's best-sized compatible one"] if auto else []
        if ngram:
            values.append(f"'{NGRAM}' for draftless prompt lookup (no draft model)")
        if mtp:
            values.append(f"'{MTP}' for the target's own MTP (NextN) layers (GLM-4.x, DeepSeek V3)")
    text = f"Draft model ({what})"
    if values:
        text += ", " + (", ".join(values[:-1]) + ", or " + values[-1] if len(values) > 1 else "or " + values[0])
    return click.option(
        "--draft", "-d", cls=DraftOption, required=required, help=f"{text}." + (f" {tail}" if tail else "")
    )


class DraftLength(click.ParamType):
    """`-k`: a positive number of draft tokens, or `auto` (None: chosen each step from measured costs)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return None
        try:
            return int(value)
        except ValueError:
            self.fail(f"expected a number of draft tokens or 'auto', got {value!r}", param, ctx)


# --- -f: a Modelfile preset -----------------------------------------------------------------------
# The file's FROM, DRAFT and speculation parameters become the defaults of the matching options
# (click's default_map), so any flag given still wins; its Ollama parameters and SYSTEM are laid
# over the target's own by `targets.apply_preset`, where the sampling flags then win in the usual way.


def _load_preset(ctx: click.Context, param: click.Parameter, value: str | None):
    if value is None:
        return None
    from ollama_spec.decoding.parameters import refusal
    from ollama_spec.models.modelfile import load_modelfile

    preset = load_modelfile(value, refusal)
    defaults = {
        "target": preset.model,
        "draft": preset.draft,
        "k": preset.parameters.get("num_speculative_tokens"),
        "draft_p_min": preset.parameters.get("draft_p_min"),
        "ngram_size": preset.parameters.get("ngram_size"),
    }
    ctx.default_map = {**(ctx.default_map or {}), **{k: v for k, v in defaults.items() if v is not None}}
    return preset


def preset_option_with(help_text: str):
    """-f with a command's own account of which Modelfile lines it uses."""
    return click.option(
        "-f", "--file", "preset", callback=_load_preset, is_eager=True, metavar="MODELFILE", help=help_text
    )


preset_option = preset_option_with(
    "A Modelfile or a shipped preset's name (e.g. llama3.1-70b): its FROM, DRAFT, PARAMETER and SYSTEM "
    "lines are the defaults, and flags override them."
)


# --- what generate, chat and serve share: speculation, sampling and loading -----------------------
# `settings` maps them onto the core's settings, with the model's Ollama params and then Ollama's own
# defaults filling what a flag leaves unset.


def speculation_options(function):
    """--draft, -k, --draft-p-min, --ngram-size, --ngram."""
    from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS, MAX_NUM_SPECULATIVE_TOKENS
    from ollama_spec.decoding.proposer_table import NGRAM
    from ollama_spec.decoding.proposers import DEFAULT_NGRAM_SIZE

    return _stack(
        draft_option(WITHOUT_DRAFT),
        click.option(
            "-k",
            "--num-speculative-tokens",
            "k",
            type=DraftLength(),
            default="auto",
            show_default=True,
            help=f"Tokens the draft proposes per step, at most {MAX_NUM_SPECULATIVE_TOKENS} (default: the model's "
            "draft_num_predict, else auto), or auto: "
            f"token by token, up to {DEFAULT_MAX_SPECULATIVE_TOKENS}, while the draft's confidence and this "
            "machine's measured step costs say the next token pays for itself.",
        ),
        click.option(
            "--draft-p-min",
            type=float,
            default=0.0,
            show_default=True,
            help="Stop drafting early when the draft's most likely next token is less likely than this.",
        ),
        click.option(
            "--ngram-size",
            type=int,
            default=DEFAULT_NGRAM_SIZE,
            show_default=True,
            help=f"With --draft {NGRAM} or --ngram: the longest n-gram looked up in the text so far.",
        ),
        click.option(
            "--ngram",
            "with_ngram",
            is_flag=True,
            help="With a draft model: also look the text so far up for what followed its last words (prompt "
            "lookup), and each step verify whichever proposal is expected to get more tokens accepted; "
            "pays where the answer copies its input (edits of a text or code, quotes, RAG answers).",
        ),
    )(function)


def sampling_options(function):
    """--temperature (-t), --top-k, --top-p, --min-p, --seed and the repetition penalties."""
    from ollama_spec.decoding.penalties import DEFAULT_REPEAT_LAST_N
    from ollama_spec.decoding.sampling import DEFAULT_MIN_P, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P

    return _stack(
        click.option(
            "--temperature",
            "-t",
            type=float,
            help=f"0 = greedy (default: the model's params, else {DEFAULT_TEMPERATURE}).",
        ),
        click.option("--top-k", type=int, help=f"0 = off (default: the model's params, else {DEFAULT_TOP_K})."),
        click.option("--top-p", type=float, help=f"1 = off (default: the model's params, else {DEFAULT_TOP_P})."),
        click.option("--min-p", type=float, help=f"0 = off (default: the model's params, else {DEFAULT_MIN_P})."),
        click.option("--seed", type=int, help="Random seed for sampling (default: random)."),
        click.option(
            "--repeat-penalty",
            type=float,
            help="Divide the logits of tokens in the last --repeat-last-n by this (1 = off; default: the "
            "model's params, else 1). Greedy too; output stays the target's.",
        ),
        click.option(
            "--repeat-last-n",
            type=int,
            help=f"The window the penalties look at (-1 = the whole text, 0 = off; default: the model's "
            f"params, else {DEFAULT_REPEAT_LAST_N}).",
        ),
        click.option("--presence-penalty", type=float, help="Subtract this from tokens in the window (default: 0)."),
        click.option(
            "--frequency-penalty", type=float, help="Subtract this per occurrence in the window (default: 0)."
        ),
    )(function)


# The target past this machine's default devices: RPC servers, several GPUs.
placement_options = _stack(
    click.option(
        "--rpc",
        envvar=RPC_ENVVAR,
        metavar="HOST:PORT[,...]",
        help="llama.cpp RPC servers (`ollama-spec rpc-server` on each machine) that take target layers beside this "
        "machine's GPUs; the draft stays here. Trusted networks only: the protocol has no authentication.",
    ),
    click.option(
        "--tensor-split",
        metavar="SHARES",
        help="Each device's share of the target, RPC servers first, then local GPUs (e.g. 3,1). Default: by free "
        "memory once the draft is placed.",
    ),
    click.option(
        "--split-mode",
        type=click.Choice(SPLIT_MODES),
        help="How the target is split over several devices: layer (default), row (each matrix), none (--main-gpu only).",
    ),
    click.option(
        "--main-gpu",
        type=int,
        help="With --split-mode none: the device that holds the whole target (index in the order above).",
    ),
)


def loading_options(function):
    """How the pair loads: GPU layers, threads, the KV cache, the memory check, repacking, flash attention,
    and the placement options."""
    return _stack(
        click.option(
            "--n-gpu-layers",
            type=int,
            default=None,
            help="Target layers on the GPU (-1: all; default: all, or as many as the memory check finds room for).",
        ),
        click.option(
            "--draft-n-gpu-layers", type=int, default=-1, show_default=True, help="Draft layers on the GPU (-1: all)."
        ),
        threads_option,
        kv_type_option,
        no_check_option,
        repack_option,
        flash_attn_option,
        placement_options,
    )(function)


format_option = click.option(
    "--format",
    "output_format",
    metavar="json|SCHEMA",
    help="Keep the output to JSON: 'json' for a JSON object, or a JSON schema it must match (inline, or a "
    "file holding it), as Ollama's --format; a llama.cpp grammar masks what the target may write.",
)

think_option = click.option(
    "--think/--no-think",
    default=None,
    help="A thinking model (Qwen3, DeepSeek-R1): think before answering, or answer at once (its chat template "
    "is told, as Ollama's --think=false does). Default: the model's own.",
)

show_draft_option = click.option(
    "--show-draft",
    is_flag=True,
    help="On a terminal, print the text of accepted draft tokens in green and the target's own plain "
    "(no colour when standard output is not a terminal, or with NO_COLOR set).",
)

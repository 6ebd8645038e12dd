"""cli/settings.py: parsed options (and where each came from) onto the core's settings, without click running."""

import click
import pytest
from click.core import ParameterSource

from ollama_spec.cli.settings import Options, placement_settings, resolved
from ollama_spec.decoding.loop import MAX_NUM_SPECULATIVE_TOKENS
from ollama_spec.errors import InvalidSetting

SAMPLING = {
    "temperature": None,
    "top_k": None,
    "top_p": None,
    "min_p": None,
    "seed": None,
    "repeat_penalty": None,
    "repeat_last_n": None,
    "presence_penalty": None,
    "frequency_penalty": None,
}
SPECULATION = {"draft": "tiny-draft", "k": None, "draft_p_min": 0.0, "ngram_size": 4}
PLACEMENT = {"rpc": None, "tensor_split": None, "split_mode": None, "main_gpu": None}


def test_a_flag_wins_over_the_models_params_and_those_over_the_defaults():
    options = Options(SAMPLING | {"temperature": 0.0, "repeat_penalty": 1.3})
    settings = resolved({"temperature": 0.7, "top_k": 7, "repeat_penalty": 1.1}, options).sampling
    assert (settings.temperature, settings.top_k, settings.top_p) == (0.0, 7, 0.9)
    assert settings.penalties.repeat_penalty == 1.3 and settings.penalties.repeat_last_n == 64


@pytest.mark.parametrize(
    ("source", "preset", "expected"),
    [
        (ParameterSource.DEFAULT, {}, 6),  # -k left at auto: the model's draft_num_predict
        (ParameterSource.COMMANDLINE, {}, None),  # -k auto given: auto
        (ParameterSource.DEFAULT, {"num_speculative_tokens": "auto"}, None),  # a preset's auto
        (ParameterSource.DEFAULT_MAP, {"num_speculative_tokens": 3}, 3),  # a preset's K, laid over the params
    ],
)
def test_k_left_unset_takes_the_models_draft_num_predict(source, preset, expected):
    options = Options(SPECULATION, {"k": source})
    assert resolved({"draft_num_predict": 6} | preset, options).speculation.num_speculative_tokens == expected


@pytest.mark.parametrize(
    ("k", "params", "said"),
    [
        (9000, {}, "-k 9000"),
        (None, {"num_speculative_tokens": 9000}, "the preset's num_speculative_tokens 9000"),
        (None, {"draft_num_predict": 9000}, "the model's draft_num_predict 9000"),
    ],
)
def test_a_k_past_one_verify_batch_is_capped_and_says_whose_it_was(k, params, said, capsys):
    options = Options(SPECULATION | {"k": k}, {"k": ParameterSource.COMMANDLINE if k else ParameterSource.DEFAULT})
    assert resolved(params, options).speculation.num_speculative_tokens == MAX_NUM_SPECULATIVE_TOKENS
    assert capsys.readouterr().err.startswith(f"note: {said} is capped to {MAX_NUM_SPECULATIVE_TOKENS}")


def test_ngram_is_a_proposer_not_a_model():
    assert resolved({}, Options(SPECULATION | {"draft": "NGram"})).speculation.proposer == "ngram"


def test_rpc_from_the_environment_drops_blank_items_a_flag_does_not():
    values = PLACEMENT | {"rpc": "10.0.0.2:50052,, ", "tensor_split": "3,1"}
    placement = placement_settings(Options(values, {"rpc": ParameterSource.ENVIRONMENT}))
    assert placement.rpc_servers == ("10.0.0.2:50052",) and placement.tensor_split == (3.0, 1.0)
    with pytest.raises(InvalidSetting, match="--rpc"):
        placement_settings(Options(values, {"rpc": ParameterSource.COMMANDLINE}))


def test_given_means_on_the_command_line():
    options = Options(
        {"target": "x", "k": 3}, {"target": ParameterSource.DEFAULT_MAP, "k": ParameterSource.COMMANDLINE}
    )
    assert not options.given("target") and options.given("k") and not options.given("absent")


# --- one resolver: the same flags and Modelfile give the same settings in every face ------------------------

PRESET = (
    "FROM tiny-target\nDRAFT tiny-draft\nPARAMETER temperature 0.6\nPARAMETER top_p 0.5\n"
    "PARAMETER num_speculative_tokens 4\n"
)


def face_settings(face: str, flags: tuple[str, ...], preset, store) -> tuple:
    """(temperature, top_p, K, draft) as `face` resolves them from its command line, parsed by click as the
    command parses it, through the face's own code (nothing loads)."""
    from ollama_spec.cli import cli
    from ollama_spec.cli.bench import bench
    from ollama_spec.cli.bench_server import served_k
    from ollama_spec.cli.chat import chat
    from ollama_spec.cli.generate import generate
    from ollama_spec.cli.serve import request_defaults, serve, store_state
    from ollama_spec.cli.settings import request_settings, server_settings
    from ollama_spec.cli.targets import apply_preset, resolve_draft
    from ollama_spec.models.resolve import resolve_model
    from ollama_spec.planning.devices import system_ram

    models = ("--models-dir", str(store))
    # under the group's own context, as the CLI parses them (its -h: a command caches its help option)
    parent = click.Context(cli, info_name="ollama-spec", **cli.context_settings)
    if face == "serve --preset":  # the whole store, the preset laid over the model it is FROM
        ctx = serve.make_context("serve", ["--preset", str(preset), "--no-check", *flags, *models], parent=parent)
        state = store_state(Options.of(ctx), str(store))
        try:
            pair = state.serving.pairs.plan("tiny-target", [system_ram(64)])
        finally:
            state.close()
        sampling, speculation = pair.settings.sampling, pair.settings.speculation
        return sampling.temperature, sampling.top_p, speculation.num_speculative_tokens, pair.draft.name
    command = {"generate": generate, "chat": chat, "serve": serve, "bench": bench}[face]
    args = ["tiny-target", "Hello"] if face == "generate" else ["tiny-target"]
    ctx = command.make_context(face, [*args, "-f", str(preset), *flags, *models], parent=parent)
    options = Options.of(ctx)
    target = apply_preset(resolve_model("tiny-target", str(store)), ctx.params["preset"])
    draft = resolve_draft(options["draft"], str(store), target).model.name
    if face == "bench":  # its rows' temperature, and the one K it serves at with --concurrency
        k = served_k(options["ks"] if options.given("ks") else None, target.params)
        return options["temperature"], None, k, draft
    if face == "serve":
        server = server_settings(options)
        settings = request_defaults(options, server).over(target.params, server)
    else:
        settings = request_settings(target, options, prompt="Hello")
    sampling, speculation = settings.sampling, settings.speculation
    return sampling.temperature, sampling.top_p, speculation.num_speculative_tokens, draft


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("-t", "0.6"), (0.6, 0.5, 4, "tiny-draft:latest")),  # the preset's top_p and K
        (("-t", "0.2", "-k", "3"), (0.2, 0.5, 3, "tiny-draft:latest")),  # flags beat the preset
        (("-t", "0", "-k", "auto"), (0.0, 0.5, None, "tiny-draft:latest")),  # -k auto beats the preset's 4
    ],
)
def test_generate_chat_bench_and_serve_resolve_the_same_flags_and_preset_alike(flags, expected, tiny_store, tmp_path):
    preset = tmp_path / "tuned.Modelfile"
    preset.write_text(PRESET)
    faces = ("generate", "chat", "serve", "serve --preset", "bench")
    got = {face: face_settings(face, flags, preset, tiny_store) for face in faces}
    assert got["bench"] == expected[:1] + (None,) + expected[2:]  # bench takes no --top-p
    assert {face: got[face] for face in faces[:-1]} == dict.fromkeys(faces[:-1], expected)


def test_without_flags_every_face_but_bench_takes_the_presets_temperature(tiny_store, tmp_path):
    """bench's -t defaults to 0 (greedy: its outputs are checked against the target alone)."""
    preset = tmp_path / "tuned.Modelfile"
    preset.write_text(PRESET)
    for face in ("generate", "chat", "serve", "serve --preset"):
        assert face_settings(face, (), preset, tiny_store) == (0.6, 0.5, 4, "tiny-draft:latest"), face
    assert face_settings("bench", (), preset, tiny_store) == (0.0, None, 4, "tiny-draft:latest")

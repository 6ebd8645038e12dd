import pytest

from ollama_spec.errors import InvalidModelName
from ollama_spec.models.names import ModelRef, is_valid_ref, parse_model_name


@pytest.mark.parametrize(
    "name, expected",
    [
        ("llama3.1:70b", ("registry.ollama.ai", "library", "llama3.1", "70b")),
        ("llama3.2", ("registry.ollama.ai", "library", "llama3.2", "latest")),
        ("user/model", ("registry.ollama.ai", "user", "model", "latest")),
        ("user/model:v2", ("registry.ollama.ai", "user", "model", "v2")),
        ("hf.co/user/repo:Q4_K_M", ("hf.co", "user", "repo", "Q4_K_M")),
        ("localhost:5000/ns/model:tag", ("localhost:5000", "ns", "model", "tag")),
        ("localhost:5000/ns/model", ("localhost:5000", "ns", "model", "latest")),
        ("https://registry.ollama.ai/library/qwen2.5:0.5b", ("registry.ollama.ai", "library", "qwen2.5", "0.5b")),
        ("http://example.com/team/m:1", ("example.com", "team", "m", "1")),
        ("  llama3  ", ("registry.ollama.ai", "library", "llama3", "latest")),
    ],
)
def test_parses_every_name_form(name, expected):
    assert parse_model_name(name).manifest_parts == expected


@pytest.mark.parametrize(
    "name, reason",
    [
        ("", "the name is empty"),
        ("../x", "namespace '..' has characters Ollama does not allow"),
        ("a/../../etc", "expected [host/][namespace/]model[:tag]"),
        ("model:..", "tag '..' has characters Ollama does not allow"),
        ("..", "model '..' has characters Ollama does not allow"),
        (".hidden", "model '.hidden' has characters Ollama does not allow"),
        ("model:", "the tag is empty"),
        ("/model", "the namespace is empty"),
        ("ns/", "the model is empty"),
        ("bad name", "model 'bad name' has characters Ollama does not allow"),
        ("ns.with.dots/model", "namespace 'ns.with.dots' has characters Ollama does not allow"),
        ("m" * 81, "the model is longer than 80 characters"),  # Ollama's isValidLen
        ("n" * 81 + "/m", "the namespace is longer than 80 characters"),
        ("m:" + "t" * 81, "the tag is longer than 80 characters"),
        ("h" * 351 + "/n/m", "the host is longer than 350 characters"),
        ("a/b/c/d", "expected [host/][namespace/]model[:tag]"),
        ("model@sha256:abc", "has characters Ollama does not allow"),
    ],
)
def test_rejects_invalid_names(name, reason):
    with pytest.raises(InvalidModelName, match="invalid model name") as err:
        parse_model_name(name)
    assert reason in str(err.value)


@pytest.mark.parametrize(
    "ref, display",
    [
        (ModelRef("registry.ollama.ai", "library", "llama3.1", "70b"), "llama3.1:70b"),
        (ModelRef("registry.ollama.ai", "user", "m", "latest"), "user/m:latest"),
        (ModelRef("hf.co", "user", "repo", "Q4_K_M"), "hf.co/user/repo:Q4_K_M"),
    ],
)
def test_display_is_ollamas_short_form(ref, display):
    assert ref.display == display
    assert parse_model_name(display) == ref


@pytest.mark.parametrize(
    "name, expected",
    [
        ("llama3.2:local", "llama3.2:latest"),  # Ollama's modelref.ParseRef: a source suffix, not a tag
        ("llama3.2:1b:local", "llama3.2:1b"),
        ("llama3.2:1b:LOCAL", "llama3.2:1b"),
        ("gpt-oss:120b:cloud", "gpt-oss:120b-cloud"),  # the stored cloud stub's name (NormalizePullName)
        ("gpt-oss:cloud", "gpt-oss:cloud"),
        ("gpt-oss:120b-cloud", "gpt-oss:120b-cloud"),
        ("localhost:11434/team/tiny:local", "localhost:11434/team/tiny:latest"),
    ],
)
def test_source_suffixes_as_ollama_reads_them(name, expected):
    assert parse_model_name(name).display == expected


def test_both_source_suffixes_are_refused():
    with pytest.raises(InvalidModelName, match="use either :local or :cloud, not both"):
        parse_model_name("llama3.2:local:cloud")


def test_parts_up_to_ollamas_lengths_pass():
    ref = parse_model_name(f"{'h' * 350}/{'n' * 80}/{'m' * 80}:{'t' * 80}")
    assert (len(ref.host), len(ref.namespace), len(ref.model), len(ref.tag)) == (350, 80, 80, 80)


def test_valid_refs_are_what_ollama_lists():
    assert is_valid_ref(("registry.ollama.ai", "library", "llama3.2", "1b"))
    assert is_valid_ref(("h" * 350, "n" * 80, "m" * 80, "t" * 80))
    for parts in (
        ("registry.ollama.ai", "library", "x", ".DS_Store"),
        ("registry.ollama.ai", "library", "x", "-p"),
        ("registry.ollama.ai", "library", "bad name", "latest"),
        ("h", "ns.dot", "m", "t"),
        ("h", "m", "t"),
        ("registry.ollama.ai", "library", "m" * 81, "latest"),
        ("h" * 351, "n", "m", "t"),
    ):
        assert not is_valid_ref(parts), parts

"""Each target's draft and its context as Ollama picks it, planned before anything loads (headers only)."""

import struct

from ollama_spec.planning.context import LARGE_CTX, MEDIUM_CTX, SMALL_CTX, choose_context, tier_for_vram
from ollama_spec.planning.devices import nvidia_gpu, system_ram
from ollama_spec.server.serving.pairs import StorePairs
from tests.conftest import engine_settings
from tests.stores import LIBRARY, variant


def test_the_default_context_is_ollamas_tier_by_gpu_memory():
    assert tier_for_vram([system_ram(64)]) == SMALL_CTX
    assert tier_for_vram([nvidia_gpu(24), system_ram(64)]) == MEDIUM_CTX
    assert tier_for_vram([nvidia_gpu(80), system_ram(64)]) == LARGE_CTX
    assert choose_context(None, 8192, [nvidia_gpu(80)], {}).n_ctx == 8192  # never past the trained length
    assert choose_context(2048, 8192, [], {}).n_ctx == 2048  # the params layer's num_ctx
    assert choose_context(None, 8192, [], {"OLLAMA_CONTEXT_LENGTH": "1024"}).n_ctx == 1024
    assert choose_context(None, 8192, [], {}, flag=16384).n_ctx == 16384  # --ctx as given


def short_trained(root, name="short-trained", length=2048):
    """tiny-target under `name`, its header's llama.context_length set to `length` (same size: still valid)."""
    import json

    from ollama_spec.synthetic.layout import add_blob

    doc = json.loads(root.joinpath(*LIBRARY, "tiny-target", "latest").read_text())
    model = doc["layers"][0]
    data = root.joinpath("blobs", model["digest"].replace(":", "-")).read_bytes()
    key = b"llama.context_length"
    at = data.index(key) + len(key) + 4  # past the key and its value type (uint32)
    data = data[:at] + struct.pack("<I", length) + data[at + 4 :]
    digest, size = add_blob(root, data)
    variant(root, name, keep=lambda layer: layer["digest"] != model["digest"], extra=[("model", (digest, size))])


def test_a_model_trained_on_less_than_4096_gets_its_own_length(store_copy):
    short_trained(store_copy)
    store = StorePairs(models_dir=str(store_copy), no_draft=True, engine=engine_settings(parallel=1))
    assert store.plan("short-trained", [system_ram(64)]).engine.n_ctx == 2048
    assert store.plan("tiny-target", [system_ram(64)]).engine.n_ctx == 4096


def test_ollama_context_length_sets_it(tiny_store, monkeypatch):
    monkeypatch.setenv("OLLAMA_CONTEXT_LENGTH", "1536")
    store = StorePairs(models_dir=str(tiny_store), no_draft=True, engine=engine_settings(parallel=1))
    assert store.plan("tiny-target", [system_ram(64)]).engine.n_ctx == 1536


def test_each_targets_draft_comes_in_order(store_copy):
    variant(store_copy, "drafted", extra=[("draft", "tiny-draft")])
    store = StorePairs(models_dir=str(store_copy), pairs={"TINY-TARGET": "ngram"})
    assert store.describe("tiny-target")[1:] == ("ngram", "--pair tiny-target:latest=ngram: n-gram prompt lookup")
    assert store.describe("drafted")[2] == "the draft layer in its manifest"
    assert store.describe("tiny-target:q8_0")[2].startswith("the store's best compatible draft")
    assert StorePairs(models_dir=str(store_copy), no_draft=True).describe("drafted")[1:] == (None, "--no-draft")


def test_the_budget_lowers_the_default_context_and_says_so(tiny_store, caplog):
    """A 24 GiB GPU makes the default 32k, capped at the trained 8192; the GPU's free memory and the RAM
    (which a GPU plan needs too: the host's buffers grow with the context) fit 4096 and not 8192, nor
    a layer split at 8192: the context goes a tier down, with a log line."""
    import logging

    from ollama_spec.planning.devices import CUDA_RESERVE, Device

    engine = engine_settings(parallel=1, memory_check=True)
    sized = {
        ctx: StorePairs(models_dir=str(tiny_store), no_draft=True, engine=engine, ctx=ctx)
        .plan("tiny-target", [nvidia_gpu(24), system_ram(64)])
        .plan
        for ctx in (SMALL_CTX, 2 * SMALL_CTX)
    }
    small, large = sized[SMALL_CTX], sized[2 * SMALL_CTX]
    assert small.gpu_bytes < large.gpu_bytes and small.host_bytes < large.host_bytes
    gpu_free = CUDA_RESERVE + (small.gpu_bytes + large.gpu_bytes) // 2
    gpu = Device("24 GiB GPU", "cuda", 24 << 30, gpu_free, CUDA_RESERVE)
    ram = system_ram(1)
    ram = Device(ram.name, ram.kind, ram.total, (small.host_bytes + large.host_bytes) // 2)
    store = StorePairs(models_dir=str(tiny_store), no_draft=True, engine=engine)
    with caplog.at_level(logging.INFO, "ollama_spec.server"):
        pair = store.plan("tiny-target", [gpu, ram])
    assert pair.target.info.context_length == 2 * SMALL_CTX and pair.engine.n_ctx == SMALL_CTX
    assert pair.plan.fits and "capped at the model's trained length" in pair.ctx_why
    assert "tiny-target:latest: context lowered from 8192 to 4096 tokens" in caplog.text
    roomy = Device(gpu.name, gpu.kind, gpu.total, CUDA_RESERVE + 2 * large.gpu_bytes, CUDA_RESERVE)
    big_ram = Device(ram.name, ram.kind, ram.total, 2 * large.host_bytes)
    assert store.plan("tiny-target", [roomy, big_ram]).engine.n_ctx == 2 * SMALL_CTX  # room: not lowered


def test_a_served_preset_is_laid_whole_as_the_commands_lay_it(tiny_store, tmp_path, caplog):
    """The server lays a -f preset with the same function as the commands (models/presets), not a
    lighter copy of its own: the MESSAGEs and a Jinja TEMPLATE too, its notes in the log."""
    from ollama_spec.models.modelfile import Modelfile
    from ollama_spec.prompting.messages import ChatMessage

    preset = Modelfile(
        tmp_path / "Modelfile",
        "tiny-target",
        parameters={"temperature": 0.2},
        system="Be brief.",
        template="{% for m in messages %}{{ m.content }}{% endfor %}",
        messages=(ChatMessage("user", "hi"), ChatMessage("assistant", "hello")),
        deprecated=("mirostat",),
    )
    pairs = StorePairs(models_dir=str(tiny_store), presets={"tiny-target": preset}, engine=engine_settings())
    with caplog.at_level("INFO", logger="ollama_spec.server"):
        target, _, _ = pairs.describe("tiny-target")
    assert target.params["temperature"] == 0.2 and target.system == "Be brief."
    assert target.messages == preset.messages and target.info.chat_template == preset.template
    assert "PARAMETER mirostat is one Ollama no longer takes" in caplog.text


def test_a_target_s_mtp_layers_draft_by_pair_and_by_default(store_copy):
    import pytest

    from ollama_spec.errors import IncompatibleDraft
    from tests.builders.mtp import build_mtp_target

    build_mtp_target(store_copy)
    store = StorePairs(models_dir=str(store_copy), pairs={"mtp-target": "mtp"}, engine=engine_settings(parallel=1))
    pair = store.plan("mtp-target", [system_ram(64)])
    assert (pair.engine.mtp, pair.draft, pair.settings.speculation.proposer) == (True, None, "mtp")
    assert not pair.engine.mtp_where_it_pays  # named: it drafts whatever it costs
    assert pair.draft_why == "--pair mtp-target:latest=mtp: the target's own MTP (NextN) layers"
    assert store.describe("mtp-target")[1] == "mtp"
    by_default = StorePairs(models_dir=str(store_copy), engine=engine_settings(parallel=1))
    default = by_default.plan("mtp-target", [system_ram(64)]).engine
    assert default.mtp and default.mtp_where_it_pays  # by default: only where it pays (engine/mtp_default.py)
    assert not by_default.plan("tiny-target", [system_ram(64)]).engine.mtp
    refused = StorePairs(models_dir=str(store_copy), pairs={"tiny-target": "mtp"})
    with pytest.raises(IncompatibleDraft, match="^--pair tiny-target:latest=mtp: tiny-target:latest has no MTP"):
        refused.plan("tiny-target", [system_ram(64)])


def test_a_target_s_default_mtp_layers_that_do_not_fit_are_let_go(store_copy):
    from dataclasses import replace

    from ollama_spec.engine.engine import pair_facts
    from ollama_spec.planning.devices import GIB
    from tests.builders.mtp import build_mtp_target

    build_mtp_target(store_copy)
    store = StorePairs(models_dir=str(store_copy), engine=engine_settings(parallel=1, memory_check=True), ctx=2048)
    roomy = store.plan("mtp-target", [system_ram(64)])
    assert roomy.engine.mtp
    need = {mtp: pair_facts(roomy.target, None, replace(roomy.engine, mtp=mtp)).plan(2048, 1, [system_ram(64)])
            for mtp in (False, True)}  # fmt: skip
    ram = system_ram(64, (need[False].host_bytes + need[True].host_bytes) / 2 / GIB)
    tight = store.plan("mtp-target", [ram])
    assert (tight.engine.mtp, tight.engine.n_ctx) == (False, 2048)
    assert tight.engine.mtp_let_go.startswith("its MTP layers do not fit beside it (does not fit: needs")
    assert not roomy.engine.mtp_let_go  # what the server says once loaded (tests/server/test_mtp_reported.py)

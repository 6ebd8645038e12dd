"""A target's MTP (NextN) layers in the memory plan: left out (as llama.cpp skips them) unless they draft, and
then counted as llama.cpp allocates them: their weights, their MTP context's KV cache and compute buffer, and
the rows kept beside them."""

from __future__ import annotations

import re

import pytest

from ollama_spec.engine.engine import Engine
from ollama_spec.llama import log as llama_log
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.planning.devices import MIB, system_ram
from ollama_spec.planning.memory import plan_memory
from ollama_spec.planning.needs import N_UBATCH, model_needs
from ollama_spec.synthetic.mtp_target import MtpShape, write_mtp_target
from tests.conftest import engine_settings

N_CTX = 2048
_BUFFER = re.compile(r"(\S+) +(model|KV|compute) buffer size = +([\d.]+) MiB")


@pytest.fixture(scope="module")
def mtp_info(tiny_models, tmp_path_factory):
    path = write_mtp_target(tmp_path_factory.mktemp("mtp") / "mtp-target.gguf", tiny_models[0].path)
    return read_model_info(path)


def logged_buffers(info, mtp: bool) -> dict[str, float]:
    """MiB llama.cpp logs for the target loaded as the engine loads it, with its MTP context where `mtp`."""
    llama_log.clear_log()
    settings = engine_settings(n_ctx=N_CTX, flash_attention="off", mtp=mtp)
    with Engine(_resolved(info), None, settings):
        pass
    sizes = {"model": 0.0, "KV": 0.0, "compute": 0.0}
    for line in llama_log.recent_log():
        if match := _BUFFER.search(line):
            sizes[match.group(2)] += float(match.group(3))
    return sizes


def _resolved(info):
    from ollama_spec.models.resolve import resolve_model

    return resolve_model(str(info.path))


def test_the_nextn_layer_is_left_out_unless_it_drafts(mtp_info):
    trunk = model_needs(mtp_info, N_CTX, flash_attention=False)
    logged = logged_buffers(mtp_info, mtp=False)
    assert trunk.file_weights / MIB == pytest.approx(logged["model"], abs=0.006)
    assert trunk.kv / MIB == pytest.approx(logged["KV"], abs=0.006)
    # the NextN block's tensors are in the file, but not in the plan
    nextn = sum(t.n_bytes for t in mtp_info.tensors if t.name.startswith(f"blk.{MtpShape().n_layer}."))
    assert nextn > 0 and trunk.file_weights == mtp_info.tensor_bytes - nextn


def test_drafting_counts_the_nextn_weights_cache_and_compute_as_llama_cpp_allocates_them(mtp_info):
    trunk = model_needs(mtp_info, N_CTX, flash_attention=False)
    both = model_needs(mtp_info, N_CTX, flash_attention=False, mtp=True)
    logged = logged_buffers(mtp_info, mtp=True)
    assert both.file_weights == mtp_info.tensor_bytes
    assert both.file_weights / MIB == pytest.approx(logged["model"], abs=0.006)
    # the NextN layer's own cache: one layer as wide as a trunk layer, for as many cells
    assert both.kv == trunk.kv * 3 // 2
    assert both.kv / MIB == pytest.approx(logged["KV"], abs=0.006)
    # the target's compute buffer and the MTP context's: never under, at most 6 % over (as for the tiny
    # models in test_memory: llama.cpp's fixed overheads weigh on buffers this small)
    assert logged["compute"] <= both.compute / MIB <= logged["compute"] * 1.06
    assert both.compute > trunk.compute
    # in RAM: the target's final state for a batch's rows, and the MTP context's
    assert both.output_buffer - trunk.output_buffer >= 2 * 4 * MtpShape().n_embd * N_UBATCH


def test_the_plan_and_its_fit_count_the_nextn_layer_only_where_it_drafts(mtp_info):
    ram = [system_ram(1.0)]
    alone, drafting = (plan_memory(mtp_info, None, N_CTX, devices=ram, mtp=mtp) for mtp in (False, True))
    assert drafting.mtp and not alone.mtp
    assert drafting.host_bytes > alone.host_bytes
    assert drafting.target.kv > alone.target.kv
    # four slots: the NextN layer's cache grows with them as the trunk's does
    four = plan_memory(mtp_info, None, N_CTX, devices=ram, mtp=True, n_seq=4)
    assert four.target.kv == 4 * drafting.target.kv

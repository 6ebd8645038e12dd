"""The memory plan across several devices: RPC servers' devices, two GPUs, --tensor-split."""

from __future__ import annotations

import math

import pytest

from ollama_spec.errors import InvalidSetting
from ollama_spec.planning.devices import GIB, nvidia_gpu, rpc_device, system_ram
from ollama_spec.planning.memory import DOES_NOT_FIT, FULL_OFFLOAD, PARTIAL_OFFLOAD, plan_memory
from ollama_spec.planning.placement import Placement, parse_tensor_split
from tests.planning.test_memory import llama_pair  # noqa: F401  (the header-only 70B + 1B fixture)


def remote(gib: float, endpoint: str = "192.168.1.20:50052"):
    return rpc_device("RPC0", endpoint, int(gib * GIB), int(gib * GIB))


def plan(target, draft, devices, **kwargs):
    return plan_memory(target, draft, 8192, "f16", devices=devices, features=frozenset(), **kwargs)


def test_two_24_gib_machines_hold_the_70b_that_one_cannot(llama_pair):
    target, draft = llama_pair
    one = plan(target, draft, [nvidia_gpu(24), system_ram(64)])
    assert one.verdict == PARTIAL_OFFLOAD
    two = plan(target, draft, [nvidia_gpu(24), system_ram(64)], remote=[remote(24)])
    assert two.verdict == FULL_OFFLOAD
    assert [d.kind for d in two.gpus] == ["rpc", "cuda"]  # llama.cpp's order: RPC servers first
    # the draft is on the local GPU, so the local GPU gets the smaller share of the target
    rpc_bytes, local_bytes = two.device_bytes
    assert two.tensor_split[0] > two.tensor_split[1]
    assert all(need <= d.usable for need, d in zip(two.device_bytes, two.gpus))
    assert abs((rpc_bytes + local_bytes) - two.gpu_bytes) < 16 << 20  # the per-device split adds up


def test_without_a_local_gpu_the_draft_is_counted_in_ram_not_on_the_server(llama_pair):
    target, draft = llama_pair
    with_draft = plan(target, draft, [system_ram(64)], remote=[remote(48)])
    alone = plan(target, None, [system_ram(64)], remote=[remote(48)])
    assert with_draft.verdict == FULL_OFFLOAD
    assert with_draft.device_bytes == alone.device_bytes  # nothing of the draft on the server
    assert with_draft.host_bytes - alone.host_bytes == with_draft.draft.cpu_total
    assert "RPC servers" in with_draft.summary


def test_a_tensor_split_that_overfills_one_device_is_refused_with_the_split_that_fits(llama_pair):
    target, draft = llama_pair
    devices = [nvidia_gpu(24), nvidia_gpu(24), system_ram(8)]
    even = plan(target, draft, devices)
    assert even.verdict == FULL_OFFLOAD
    lopsided = plan(target, draft, devices, tensor_split=(9, 1))
    assert lopsided.verdict in (PARTIAL_OFFLOAD, DOES_NOT_FIT)
    assert any(s.startswith("--tensor-split ") and "fits with full offload" in s for s in lopsided.suggestions)


def test_one_device_plans_as_before(llama_pair):
    target, draft = llama_pair
    single = plan(target, draft, [nvidia_gpu(80), system_ram(64)])
    assert single.verdict == FULL_OFFLOAD and single.tensor_split == ()
    assert single.device_bytes == (single.gpu_bytes,)


@pytest.mark.parametrize("text, shares", [("3,1", (3.0, 1.0)), ("0.75,0.25", (0.75, 0.25)), ("1", (1.0,)), (None, ())])
def test_tensor_split_parsing(text, shares):
    assert parse_tensor_split(text) == shares


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tensor_split": (0.0, 0.0)}, "positive sum"),
        ({"tensor_split": (-1.0, 2.0)}, "positive sum"),
        ({"tensor_split": (1.0,) * 17}, "at most 16"),
        ({"split_mode": "tensor"}, "--split-mode must be one of none, layer, row"),
        ({"main_gpu": -1}, "--main-gpu must be a device index"),
        ({"tensor_split": (math.inf, 1.0)}, "finite shares"),
        ({"tensor_split": parse_tensor_split("1e400")}, "finite shares"),
        ({"tensor_split": (math.nan,)}, "finite shares"),
        ({"rpc_servers": ("10.0.0.2:50052",), "split_mode": "row"}, "--split-mode row .* use --split-mode layer"),
    ],
)
def test_bad_placements_are_refused(kwargs, message):
    with pytest.raises(InvalidSetting, match=message):
        Placement(**kwargs)
    with pytest.raises(InvalidSetting, match="not a list of numbers"):
        parse_tensor_split("3:1,x")


def test_split_mode_none_plans_the_target_on_the_main_device_alone(llama_pair):
    target, draft = llama_pair
    devices = [nvidia_gpu(24, "GPU 0"), nvidia_gpu(48, "GPU 1"), system_ram(64)]
    on_first = plan(target, draft, devices, main_device=0)
    on_second = plan(target, draft, devices, main_device=1)
    assert [d.name for d in on_first.gpus] == ["GPU 0"] and on_first.verdict == PARTIAL_OFFLOAD
    assert [d.name for d in on_second.gpus] == ["GPU 1"] and on_second.verdict == FULL_OFFLOAD
    with pytest.raises(InvalidSetting, match=r"--main-gpu 2: there are 2 devices to offload to \(GPU 0, GPU 1\)"):
        plan(target, draft, devices, main_device=2)
    assert Placement(split_mode="none", main_gpu=1).main_device == 1 and Placement(main_gpu=1).main_device is None


def test_readme_rpc_plan_is_what_check_prints(llama_pair):
    from pathlib import Path

    from ollama_spec.cli.check import render_plan
    from ollama_spec.planning.devices import CUDA_RESERVE

    target, draft = llama_pair
    server = rpc_device("RPC0", "192.168.1.20:50052", 24 * GIB, 24 * GIB - CUDA_RESERVE)
    rpc_plan = plan(target, draft, [nvidia_gpu(24, "GPU 0: RTX 4090"), system_ram(64)], remote=[server])
    readme = (Path(__file__).resolve().parents[2] / "docs" / "multi-machine.md").read_text(encoding="utf-8")
    for line in render_plan(rpc_plan, [("llama3.1:70b", target), ("llama3.2:1b", draft)])[-6:]:
        assert line in readme, f"docs/multi-machine.md's RPC plan is out of date: {line!r}"


def test_a_tensor_split_longer_than_the_devices_is_refused(llama_pair):
    target, draft = llama_pair
    with pytest.raises(
        InvalidSetting,
        match=r"--tensor-split has 3 shares but there are 2 devices to offload to "
        r"\(RPC0 at 192.168.1.20:50052, 24 GiB GPU\): give one share per device",
    ):
        plan(target, draft, [nvidia_gpu(24), system_ram(64)], remote=[remote(24)], tensor_split=(1, 1, 1))
    with pytest.raises(InvalidSetting, match="--tensor-split: there is no GPU or RPC server to split the target over"):
        plan(target, draft, [system_ram(64)], tensor_split=(1,))
    assert plan(target, draft, [nvidia_gpu(24), system_ram(64)], remote=[remote(24)], tensor_split=(1, 1)).fits


def test_no_gpu_here_is_not_said_when_the_target_is_planned_onto_rpc_servers(llama_pair):
    note = "no GPU found: planning for CPU RAM"
    target, draft = llama_pair
    kwargs = {"devices": [system_ram(64)], "notes": [note], "features": frozenset()}
    assert note in plan_memory(target, draft, 8192, **kwargs).warnings
    assert note not in plan_memory(target, draft, 8192, remote=[remote(48)], **kwargs).warnings

"""Where the target's layers go past this machine's default: RPC servers' devices and several GPUs.

One frozen value carries llama.cpp's own knobs (--rpc, --tensor-split, --split-mode, --main-gpu)
from the command line to the memory plan and the loader; the draft always loads with the default,
local placement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ollama_spec.errors import InvalidSetting

SPLIT_MODES = ("none", "layer", "row")  # llama.cpp's LLAMA_SPLIT_MODE_NONE, _LAYER, _ROW
MAX_DEVICES = 16  # llama.cpp's LLAMA_MAX_DEVICES: entries in a tensor split


@dataclass(frozen=True)
class Placement:
    rpc_servers: tuple[str, ...] = ()  # "host:port" of llama.cpp RPC servers, in the order given
    # each device's share of the target's layers (llama.cpp's order: RPC servers, then local GPUs);
    # () lets the memory plan choose
    tensor_split: tuple[float, ...] = ()
    split_mode: str = "layer"  # none: one device (main_gpu); layer: whole layers; row: rows of each matrix
    main_gpu: int = 0

    def __post_init__(self) -> None:
        if self.split_mode not in SPLIT_MODES:
            raise InvalidSetting(f"--split-mode must be one of {', '.join(SPLIT_MODES)}, got {self.split_mode!r}")
        if self.split_mode == "row" and self.rpc_servers:
            # llama.cpp's RPC devices have no split buffer type: the load would fail after the probe
            raise InvalidSetting(
                "--split-mode row splits matrices over one machine's GPUs only; llama.cpp's RPC "
                "servers take whole layers: use --split-mode layer (the default) with --rpc"
            )
        if self.main_gpu < 0:
            raise InvalidSetting(f"--main-gpu must be a device index (0 or more), got {self.main_gpu}")
        if self.tensor_split:
            if len(self.tensor_split) > MAX_DEVICES:
                raise InvalidSetting(
                    f"--tensor-split has {len(self.tensor_split)} entries; llama.cpp takes at most {MAX_DEVICES}"
                )
            if not all(math.isfinite(share) for share in self.tensor_split):  # inf, 1e400, nan
                raise InvalidSetting("--tensor-split needs finite shares, e.g. 3,1")
            if any(share < 0 for share in self.tensor_split) or not sum(self.tensor_split) > 0:
                raise InvalidSetting("--tensor-split needs shares of 0 or more with a positive sum, e.g. 3,1")

    @property
    def main_device(self) -> int | None:
        """The one offload device the memory plan counts with --split-mode none, else None (all)."""
        return self.main_gpu if self.split_mode == "none" else None

    @property
    def is_default(self) -> bool:
        return self == Placement()


def parse_tensor_split(text: str | None) -> tuple[float, ...]:
    """`3,1` or `0.75,0.25`: each device's share, as llama.cpp's --tensor-split takes it."""
    if not text:
        return ()
    try:
        return tuple(float(part) for part in text.replace("/", ",").split(","))
    except ValueError:
        raise InvalidSetting(
            f"--tensor-split: {text!r} is not a list of numbers (e.g. 3,1 puts three quarters "
            "of the layers on the first device)"
        ) from None

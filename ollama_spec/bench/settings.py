"""What a benchmark measures: one frozen dataclass, defaults as named constants."""

from __future__ import annotations

from dataclasses import dataclass

from ollama_spec.errors import InvalidSetting
from ollama_spec.planning.placement import Placement

DEFAULT_KS = (1, 2, 3, 4, 6, 8, 12, 16)
DEFAULT_BENCH_TOKENS = 256
DEFAULT_RUNS = 3
DEFAULT_SEED = 0
WARMUP_TOKENS = 16  # enough to page in every weight and warm the caches
CALIBRATION_REPEATS = 7


@dataclass(frozen=True)
class BenchSettings:
    ks: tuple[int, ...] = DEFAULT_KS
    auto: bool = True  # also a row with K chosen each step (-k auto)
    ngram: bool = True  # also a row of draftless n-gram lookup through the same loop
    max_tokens: int = DEFAULT_BENCH_TOKENS
    runs: int = DEFAULT_RUNS
    temperature: float = 0.0
    seed: int = DEFAULT_SEED
    warmup: bool = True
    n_threads: int | None = None
    n_ctx: int | None = None  # None: room for the prompt and max_tokens
    memory_check: bool = True
    repack: bool | None = None  # llama.cpp's repacked CPU weights (None: canary.decide_repack)
    flash_attention: str = "auto"  # runtime.choose_flash_attention; the reference rows get the same
    placement: Placement = Placement()  # the target's RPC servers and GPU split (--rpc ...)
    mtp: bool = False  # the target's own MTP (NextN) layers draft (--draft mtp)

    def __post_init__(self) -> None:
        if not self.ks or any(k < 1 for k in self.ks):
            raise InvalidSetting(
                f"-k needs positive numbers of draft tokens beside auto (the reference rows run at "
                f"the best fixed K), got {self.ks}"
            )
        if self.max_tokens < 2:
            raise InvalidSetting(
                f"--max-tokens must be at least 2 (tok/s is timed after the first), got {self.max_tokens}"
            )
        if self.runs < 1:
            raise InvalidSetting(f"--runs must be at least 1, got {self.runs}")
        if not self.temperature >= 0:
            raise InvalidSetting(f"--temperature must be >= 0, got {self.temperature}")
        if self.n_threads is not None and self.n_threads < 1:
            raise InvalidSetting(f"--threads must be at least 1, got {self.n_threads}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def context(self) -> int:
        # 1024 tokens of room for the prompt and the last verify batch
        return self.n_ctx or max(4096, self.max_tokens + 1024)


def parse_k_list(text: str) -> tuple[tuple[int, ...], bool]:
    """ "auto,1,2,4" -> ((1, 2, 4), True): sorted, without repeats; anything else is an InvalidSetting."""
    parts = [p.strip().lower() for p in text.split(",")]
    numbers = [p for p in parts if p != "auto"]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in numbers):
        raise InvalidSetting(
            f"-k must be a comma-separated list of positive integers and 'auto', like auto,1,2,4; got '{text}'"
        )
    return tuple(sorted({int(p) for p in numbers})), "auto" in parts

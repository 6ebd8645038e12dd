"""Token pieces in, text out: UTF-8 reassembly, stop strings, and special tokens kept out of sight.

A piece may end inside a UTF-8 character, and a stop string may span several pieces, so text is
held back while it could still be the start of a stop. Stops match the text *with* special
tokens, as Ollama's do (Llama 3's params layer stops on `<|start_header_id|>`), but the text of a
special token is never part of the answer.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Feed each generated token's bytes to `push`; call `finish` once at the end."""

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = tuple(s for s in stops if s)
        self.stopped = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded, not yet shown: it may begin a stop string
        self._visible: list[bool] = []  # per held character: False for special-token text

    def push(self, piece: bytes, *, special: bool = False) -> str:
        """Add one token's bytes; return the text that is now safe to show ("" if none).

        After a stop string completes, `stopped` is True and the stop and all after it are dropped.
        """
        text = self._decoder.decode(piece)
        self._held += text
        self._visible += [not special] * len(text)
        hits = [i for i in (self._held.find(stop) for stop in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            # A byte still pending in the decoder belongs to the cut-off text: never flush it.
            return self._take(min(hits), then_drop_rest=True)
        return self._take(len(self._held) - self._stop_prefix_length())

    def finish(self) -> str:
        """The text held back for a stop string that never came (nothing after a stop)."""
        if self.stopped:
            return ""
        # Bytes still pending in the decoder are a character the last token began and no token
        # finished (an answer cut by its length): dropped, as Ollama's runner drops them, not shown as �.
        self._decoder.reset()
        return self._take(len(self._held))

    def _take(self, n: int, *, then_drop_rest: bool = False) -> str:
        shown = "".join(c for c, visible in zip(self._held[:n], self._visible) if visible)
        if then_drop_rest:
            self._held, self._visible = "", []
        else:
            self._held, self._visible = self._held[n:], self._visible[n:]
        return shown

    def _stop_prefix_length(self) -> int:
        """Length of the longest suffix of the held text that begins some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(self._held)), best, -1):
                if self._held.endswith(stop[:n]):
                    best = n
                    break
        return best

"""Token pieces to text: stop strings across pieces, special tokens, split UTF-8 characters."""

import codecs

from hypothesis import given
from hypothesis import strategies as st

from ollama_spec.prompting.text_stream import Run, TextStream, drafted_spans, merge_runs


def feed(stream, *pieces):
    shown = ""
    for piece in pieces:
        special = isinstance(piece, tuple)
        shown += stream.push(piece[0] if special else piece, special=special)
        if stream.stopped:
            break
    return shown + stream.finish()


def test_text_passes_through_and_a_stop_across_pieces_is_cut():
    assert feed(TextStream(), b"Hello", b" world") == "Hello world"
    stream = TextStream(["END"])
    assert feed(stream, b"one E", b"N", b"D two") == "one "
    assert stream.stopped


def test_text_held_for_a_stop_that_never_comes_is_released():
    stream = TextStream(["ENDING"])
    assert stream.push(b"one EN") == "one "  # "EN" might start the stop
    assert stream.push(b"D") == ""
    assert stream.finish() == "END" and not stream.stopped


def test_special_token_text_is_never_shown_but_stops_match_it():
    assert feed(TextStream(), b"a", (b"<|end_header_id|>",), b"b") == "ab"
    stream = TextStream(["<|start_header_id|>"])
    assert feed(stream, b"Hi.", (b"<|start_header_id|>",), b"user") == "Hi."
    assert stream.stopped
    # A stop that spans ordinary text and a special token (Qwen's "\n<|im_start|>").
    assert feed(TextStream(["\n<|im_start|>"]), b"x\n", (b"<|im_start|>",)) == "x"


def test_no_replacement_character_after_a_stop_that_ends_inside_a_utf8_sequence():
    # The piece that completes "ab" also starts "é" (0xC3 0xA9): that byte is cut with the stop.
    stream = TextStream(["ab"])
    assert feed(stream, b"xab\xc3") == "x"
    # An answer cut by its length inside a character (the last token began an emoji): the dangling
    # bytes are dropped, as Ollama's runner drops them, never shown as U+FFFD
    assert feed(TextStream(), b"x\xc3") == "x"
    assert feed(TextStream(), b"ok \xf0\x9f", b"\x98") == "ok "
    assert feed(TextStream(), b"\xff bad") == "\ufffd bad"  # bytes that are not UTF-8 at all still show
    assert feed(TextStream(), b"caf\xc3", b"\xa9") == "café"


def runs_of(stream, *pieces):
    """(bytes, drafted) pieces pushed as a generation pushes them; every run released, in order."""
    runs = []
    for piece, drafted in pieces:
        runs += stream.push_runs(piece, drafted=drafted)
        if stream.stopped:
            break
    return runs + stream.finish_runs()


def test_runs_say_which_text_the_draft_proposed_and_join_to_the_plain_text():
    pieces = [(b"The", False), (b" quick", True), (b" brown", True), (b" fox", False)]
    runs = runs_of(TextStream(), *pieces)
    assert runs == [Run("The", False), Run(" quick", True), Run(" brown", True), Run(" fox", False)]
    assert merge_runs(runs) == [Run("The", False), Run(" quick brown", True), Run(" fox", False)]
    assert drafted_spans(runs) == [(3, 15)]
    assert "".join(r.text for r in runs) == feed(TextStream(), *(p for p, _ in pieces))


def test_text_held_for_a_stop_keeps_its_provenance_when_released_or_cut():
    # "E" (drafted) and "N" (the target's) are held while they might begin "END", then released.
    stream = TextStream(["END"])
    assert stream.push_runs(b"one E", drafted=True) == [Run("one ", True)]
    assert stream.push_runs(b"N") == []
    assert stream.push_runs(b"o", drafted=True) == [Run("E", True), Run("N", False), Run("o", True)]
    # A stop that completes drops itself and all after it, whichever model wrote them.
    runs = runs_of(TextStream(["END"]), (b"a", False), (b"bE", True), (b"ND c", False))
    assert merge_runs(runs) == [Run("a", False), Run("b", True)]
    assert runs_of(TextStream(["ENDING"]), (b"x EN", True), (b"D", False)) == [
        Run("x ", True),
        Run("EN", True),
        Run("D", False),
    ]


def test_a_character_split_across_tokens_is_drafted_only_if_all_its_bytes_were():
    # "é" is 0xC3 0xA9; "😘" is 0xF0 0x9F 0x98 0x98.
    assert runs_of(TextStream(), (b"caf\xc3", True), (b"\xa9!", True)) == [Run("caf", True), Run("\xe9!", True)]
    assert runs_of(TextStream(), (b"caf\xc3", True), (b"\xa9!", False)) == [Run("caf", True), Run("\xe9!", False)]
    assert runs_of(TextStream(), (b"caf\xc3", False), (b"\xa9!", True)) == [
        Run("caf", False),
        Run("\xe9", False),
        Run("!", True),
    ]
    emoji = [(b"\xf0", True), (b"\x9f", False), (b"\x98", True), (b"\x98 ok", True)]
    assert merge_runs(runs_of(TextStream(), *emoji)) == [Run("\U0001f618", False), Run(" ok", True)]
    emoji = [(b"\xf0", True), (b"\x9f", True), (b"\x98", True), (b"\x98 ok", True)]
    assert merge_runs(runs_of(TextStream(), *emoji)) == [Run("\U0001f618 ok", True)]


def test_special_token_text_is_in_no_run():
    stream = TextStream()
    runs = stream.push_runs(b"a", drafted=True) + stream.push_runs(b"<|eot_id|>", special=True, drafted=True)
    assert runs + stream.push_runs(b"b") + stream.finish_runs() == [Run("a", True), Run("b", False)]


# pieces of UTF-8 text cut anywhere (a character may span pieces), some of them a special token's text
PIECES = st.lists(
    st.tuples(
        st.text(alphabet="ab é😘<|>", max_size=6).map(str.encode), st.integers(0, 5), st.booleans(), st.booleans()
    ),
    max_size=12,
)


@given(PIECES)
def test_the_text_without_stops_is_the_text_with_a_stop_that_never_comes(pieces):
    """A stream with no stop strings shows text at once (no characters held, no marks kept); it must
    show what the general path shows, split characters and special tokens included."""
    chunks = []
    for data, cut, special, drafted in pieces:
        chunks += [(data[:cut], special, drafted), (data[cut:], special, drafted)]
    shown = []
    for stream in (TextStream(), TextStream(["\x00\x00"])):
        text = "".join(stream.push(data, special=special, drafted=drafted) for data, special, drafted in chunks)
        shown.append(text + stream.finish())
    assert shown[0] == shown[1]
    runs = TextStream()  # runs after plain pushes: the draft marks of a character split across them
    for data, special, drafted in chunks[:3]:
        runs.push(data, special=special, drafted=drafted)
    general = TextStream(["\x00\x00"])
    for data, special, drafted in chunks[:3]:
        general.push(data, special=special, drafted=drafted)
    rest = chunks[3:]
    assert [r for d, sp, dr in rest for r in runs.push_runs(d, special=sp, drafted=dr)] + runs.finish_runs() == [
        r for d, sp, dr in rest for r in general.push_runs(d, special=sp, drafted=dr)
    ] + general.finish_runs()


def _longest_stop_start(text: str, stops) -> int:
    """The length of the longest end of `text` that begins a stop (the most a stream may hold back)."""
    return max((n for stop in stops for n in range(1, len(stop)) if text.endswith(stop[:n])), default=0)


@given(PIECES, st.lists(st.text(alphabet="ab é😘<|>", min_size=1, max_size=4), max_size=3))
def test_with_stops_each_push_shows_what_holding_it_shows_and_holds_only_a_stops_start(pieces, stops):
    """With stops, text in which no stop could begin is shown without being held (push's quick path):
    each push must show what the held path shows (push_runs holds every piece), and what is held back
    must be exactly the longest end of the text that begins a stop."""
    quick, held = TextStream(stops), TextStream(stops)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = shown = ""
    specials = False
    for data, cut, special, drafted in pieces:
        for part in (data[:cut], data[cut:]):
            piece = quick.push(part, special=special, drafted=drafted)
            assert piece == "".join(run.text for run in held.push_runs(part, special=special, drafted=drafted))
            assert quick.stopped == held.stopped
            if quick.stopped:
                return
            text, shown, specials = text + decoder.decode(part), shown + piece, specials or special
            if not specials:
                assert shown == text[: len(text) - _longest_stop_start(text, quick.stops)]
    assert quick.finish() == "".join(run.text for run in held.finish_runs())

"""Token pieces to text: stop strings across pieces, special tokens, split UTF-8 characters."""

from ollama_spec.prompting.text_stream import TextStream


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

"""How a streamed answer is split for the APIs (AnswerParts): thinking, content and tool calls, the
same however the text arrives."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ollama_spec.prompting.messages import ToolCall
from ollama_spec.prompting.thinking import ThinkingSplit
from ollama_spec.server.protocol.answer import AnswerParts

TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]
CASES = [
    # answer, (thinking, content, calls)
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', ("", "", [ToolCall("get_weather", {"city": "Oslo"})])),
    (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
        ("", "Let me check.\n", [ToolCall("get_weather", {})]),
    ),
    ("Plain <b>text</b>, then <tool", ("", "Plain <b>text</b>, then <tool", [])),
    (
        '<tool_call>{"name": "fly", "arguments": {}}</tool_call>',  # not an offered tool: text
        ("", '<tool_call>{"name": "fly", "arguments": {}}</tool_call>', []),
    ),
    (
        '<think>Weather needs a tool.</think>\n\n{"name": "get_weather", "arguments": {}}',
        ("Weather needs a tool.", "", [ToolCall("get_weather", {})]),
    ),
]


def split(answer, size):
    parts = AnswerParts(TOOLS, ThinkingSplit())
    thinking = content = ""
    for start in range(0, len(answer), size):
        a, b = parts.push(answer[start : start + size])
        thinking, content = thinking + a, content + b
    a, b, calls = parts.finish()
    return thinking + a, content + b, calls


@pytest.mark.parametrize("answer, expected", CASES)
def test_the_same_parts_however_the_answer_arrives(answer, expected):
    for size in (1, 2, 3, 8, 1000):
        assert split(answer, size) == expected, size
    assert AnswerParts(TOOLS, ThinkingSplit()).whole(answer) == expected


def test_a_possible_call_is_never_sent_as_text():
    parts = AnswerParts(TOOLS)
    assert parts.push('{"name": "get_') == ("", "")  # may be a call: held
    assert parts.push("Sure, ") == ("", "")  # still one JSON-looking answer: held until it cannot be
    parts = AnswerParts(TOOLS)
    assert parts.push("Sure, <tool_c") == ("", "Sure, ")  # a marker may be arriving: it is held
    assert parts.push("all>") == ("", "")


def test_without_tools_nothing_is_held():
    parts = AnswerParts()
    assert parts.push('{"name": "get_weather"') == ("", '{"name": "get_weather"')
    assert parts.finish() == ("", "", [])


# show_draft: the content's marks follow it through the thinking tags and the tool calls. The text
# is built from segments whose fate is known (sent as content or not), each character marked at
# random; the marks of what is sent must be those of the content characters, in order, however the
# text arrives. The alphabet cannot spell a tag, so only the segments' own tags are read as tags.
TEXT = st.text("ab <>/\n", max_size=10)
CALL = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'


@st.composite
def marked_answers(draw):
    thinks = draw(st.booleans())
    segments = [("<think>", False), (draw(TEXT).strip() + "x", False), ("</think>", False), ("\n\n", False)]
    segments = segments if thinks else []
    segments.append(("a" + draw(TEXT), True))  # content starts with a letter: never a bare call
    if draw(st.booleans()):  # a call, then text that parse_tool_calls keeps around it, stripped
        pad = draw(st.sampled_from(["", " ", "\n "]))
        segments += [(CALL, False), (pad, False), (draw(TEXT).strip(), True), (pad, False)]
    text = "".join(s for s, _ in segments)
    marks = tuple(draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text))))
    content, at = [], 0
    for segment, sent in segments:
        content += [(c, marks[at + i]) for i, c in enumerate(segment)] if sent else []
        at += len(segment)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    return thinks, text, marks, cuts, content


@given(marked_answers())
def test_the_content_keeps_its_own_marks_through_thinking_and_tool_calls(case):
    thinks, text, marks, cuts, content = case
    expected_text, expected_marks = "".join(c for c, _ in content), tuple(m for _, m in content)
    parts = AnswerParts(TOOLS, ThinkingSplit() if thinks else None)
    sent, sent_marks = "", ()
    for start, end in zip([0, *cuts], [*cuts, len(text)]):
        _, piece, piece_marks = parts.push_marked(text[start:end], marks[start:end])
        assert piece_marks is not None and len(piece_marks) == len(piece)
        sent, sent_marks = sent + piece, sent_marks + piece_marks
    _, rest, _, rest_marks = parts.finish_marked()
    assert rest_marks is not None
    assert (sent + rest, sent_marks + rest_marks) == (expected_text, expected_marks)
    whole = AnswerParts(TOOLS, ThinkingSplit() if thinks else None).whole_marked(text, marks)
    assert (whole[1], whole[3]) == (expected_text, expected_marks)


def test_without_marks_the_parts_are_those_of_plain_push():
    parts = AnswerParts(TOOLS, ThinkingSplit())
    assert parts.push_marked("<think>hm</think>Hi", None) == ("hm", "Hi", None)
    assert parts.finish_marked() == ("", "", [], None)

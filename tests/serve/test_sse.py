"""`sse_lines`: SSE lines end at LF, CRLF or CR only, whatever the chunking."""

from __future__ import annotations

import asyncio
import json

from hypothesis import given
from hypothesis import strategies as st

from presched.serve.sse import sse_lines


def lines_of(chunks: list[bytes]) -> list[str]:
    async def gen():
        for c in chunks:
            yield c

    async def collect():
        return [line async for line in sse_lines(gen())]

    return asyncio.run(collect())


# characters str.splitlines (and so httpx's aiter_lines) treats as line ends; JSON keeps them raw
SPLITLINES_ONLY = "\u2028\u2029\u0085\x1c\x1d\x1e\x0b\x0c"


def test_an_event_whose_text_holds_unicode_line_separators_stays_whole():
    text = "a" + SPLITLINES_ONLY + "b"
    event = "data: " + json.dumps({"choices": [{"text": text}]}, ensure_ascii=False)
    body = (event + "\n\ndata: [DONE]\n\n").encode()
    got = [line for line in lines_of([body]) if line]
    assert got == [event, "data: [DONE]"]
    assert json.loads(got[0][6:])["choices"][0]["text"] == text


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\r\n"), max_size=30), max_size=8),
       st.sampled_from(["\n", "\r\n", "\r"]), st.data())  # fmt: skip
def test_any_chunking_and_line_end_gives_the_same_lines(lines, end, data):
    body = "".join(line + end for line in lines).encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=6)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
    assert lines_of(chunks) == lines


def test_a_last_line_without_its_end_is_kept_and_a_split_utf8_character_survives():
    body = "data: é\ndata: x".encode()
    assert lines_of([body[:7], body[7:]]) == ["data: é", "data: x"]  # 'é' cut between chunks

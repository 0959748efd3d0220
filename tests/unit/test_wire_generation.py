"""The generation contract of ``schemas/README.md`` ("Generation", "LLM work") against
``schemas.generation``: requests a client writes from the page decode, bad ones are refused
with a message naming the field, and the stream's messages read as the page says."""

from __future__ import annotations

import msgpack
import pytest

from schemas import errors, subjects
from schemas.errors import ServingError
from schemas.generation import (
    MAX_TOKENS_LIMIT,
    GenerateDone,
    LlmWork,
    decode_generate_request,
    encode_chunk,
)
from schemas.messages import decode_map


def client(msg: dict) -> dict:
    """A request as a client in any language writes it: a plain msgpack map."""
    return decode_map(msgpack.packb(msg, use_bin_type=True))


def test_a_request_written_from_the_readme_decodes():
    req = decode_generate_request(client({
        "v": 1, "id": "g-1", "prompt": "Once upon a time", "max_tokens": 16,
        "stop": ["\n\n"], "chat": True, "ttft_slo_ms": 500, "tpot_slo_ms": 80.5}),
        "smollm2-135m")
    assert (req.id, req.model, req.prompt, req.max_tokens) == ("g-1", "smollm2-135m",
                                                               "Once upon a time", 16)
    assert req.stop == ["\n\n"] and req.chat and req.ttft_slo_ms == 500.0
    tokens = decode_generate_request(client({"v": 1, "id": "g-2", "prompt_tokens": [1, 2, 3],
                                             "max_tokens": 1}), "m")
    assert tokens.prompt_tokens == [1, 2, 3] and tokens.prompt is None
    assert decode_generate_request(decode_map(req.encode()), "smollm2-135m") == req
    assert subjects.generate("smollm2-135m") == "offramp.generate.smollm2-135m"


@pytest.mark.parametrize("change,field", [
    ({"prompt": ""}, "prompt"),
    ({"prompt": None}, "prompt"),                       # neither prompt nor prompt_tokens
    ({"prompt_tokens": [1]}, "prompt"),                 # both
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": MAX_TOKENS_LIMIT + 1}, "max_tokens"),
    ({"max_tokens": "8"}, "max_tokens"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["x"] * 9}, "stop"),
    ({"ttft_slo_ms": -1}, "ttft_slo_ms"),
    ({"id": ""}, "id"),
    ({"model": "other"}, "model"),
])
def test_bad_requests_are_refused_naming_the_field(change, field):
    msg = {"v": 1, "id": "g", "prompt": "hi", "max_tokens": 4, **change}
    with pytest.raises(ServingError) as refused:
        decode_generate_request(client(msg), "m")
    assert refused.value.code == errors.BAD_REQUEST and field in refused.value.message


def test_empty_prompt_tokens_and_negative_ids_are_refused():
    for tokens in ([], [3, -1]):
        with pytest.raises(ServingError, match="prompt_tokens"):
            decode_generate_request(client({"v": 1, "id": "g", "prompt_tokens": tokens,
                                            "max_tokens": 4}), "m")


def test_the_stream_reads_as_the_readme_says():
    chunk = msgpack.unpackb(encode_chunk("g", 0, [5, 6], " the", [9, 30]), raw=False,
                            strict_map_key=False)
    assert chunk == {"v": 1, "id": "g", "seq": 0, "tokens": [5, 6], "text": " the",
                     "exits": [9, 30]}
    done = msgpack.unpackb(GenerateDone("g", "m", "length", 4, 2, 10.0, 5.0, 15.0,
                                        {30: 1, 9: 1}, "m", 30).encode(), raw=False,
                           strict_map_key=False)
    assert done["done"] is True and done["finish"] == "length" and "error" not in done
    assert done["usage"] == {"prompt_tokens": 4, "completion_tokens": 2}
    assert set(done["timings"]) == {"ttft_ms", "tpot_ms", "total_ms"}
    assert done["exits"] == {9: 1, 30: 1} and (done["candidate"], done["depth"]) == ("m", 30)


def test_llm_work_round_trips():
    work = LlmWork("offramp.results.router-1", "_INBOX.c.1", b"\x81\xa1v\x01", 3.5)
    assert LlmWork.decode(decode_map(work.encode())) == work

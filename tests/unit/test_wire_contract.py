"""The wire contract of ``schemas/README.md`` against the code that implements it.

The client below is written from the README alone (msgpack + numpy, no ``schemas.codec``):
if it and ``schemas.codec`` / ``schemas.messages`` disagree on a byte, a client in another
language written from the same page would be broken too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from schemas import errors, subjects
from schemas.codec import pack, unpack
from schemas.errors import ServingError
from schemas.heartbeat import Heartbeat
from schemas.helios import (
    BreachAlert,
    GenerationRecord,
    GenerationTelemetry,
    HeliosChoice,
)
from schemas.messages import (
    Batch,
    ExitConfig,
    InferRequest,
    Results,
    decode_infer_request,
    decode_map,
    encode_error,
    encode_reply,
)
from schemas.telemetry import OK, RampFeatures, RequestRecord, RequestTelemetry, SampleTelemetry

README = Path(__file__).resolve().parents[2] / "schemas" / "README.md"

# ---------------------------------------------------------------- client from the README

TENSOR_EXT = 1
ALLOWED_KINDS = "biuf"


def client_tensor(arr: np.ndarray) -> msgpack.ExtType:
    arr = np.ascontiguousarray(arr)
    payload = msgpack.packb([arr.dtype.str, list(arr.shape), arr.tobytes()], use_bin_type=True)
    return msgpack.ExtType(TENSOR_EXT, payload)


def raw_tensor(dtype: Any, shape: Any, data: Any) -> msgpack.ExtType:
    """A tensor built field by field, to make malformed ones."""
    return msgpack.ExtType(TENSOR_EXT, msgpack.packb([dtype, shape, data], use_bin_type=True))


def _client_ext_hook(code: int, payload: bytes) -> np.ndarray:
    assert code == TENSOR_EXT, f"unknown ext type {code}"
    dtype_s, shape, data = msgpack.unpackb(payload, raw=False)
    dtype = np.dtype(dtype_s)
    assert dtype.kind in ALLOWED_KINDS, dtype_s
    assert isinstance(data, bytes)
    assert len(data) == int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def client_encode(msg: dict[str, Any]) -> bytes:
    def default(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return client_tensor(obj)
        raise TypeError(type(obj).__name__)

    return msgpack.packb(msg, default=default, use_bin_type=True)


def client_decode(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_client_ext_hook, raw=False, strict_map_key=False)


def client_request(rid: str, model: str, inputs: dict[str, np.ndarray],
                   slo_ms: float | None = None) -> bytes:
    msg: dict[str, Any] = {"v": 1, "id": rid, "model": model, "inputs": inputs}
    if slo_ms is not None:
        msg["slo_ms"] = float(slo_ms)
    return client_encode(msg)


def assert_bad_request(data: bytes) -> ServingError:
    with pytest.raises(ServingError) as info:
        decode_map(data)
    assert info.value.code == errors.BAD_REQUEST
    assert info.value.message
    return info.value


def readme() -> str:
    return README.read_text(encoding="utf-8")


def readme_section(title: str) -> str:
    text = readme()
    start = text.index(f"\n### {title}\n")
    nxt = re.search(r"\n##+ ", text[start + 1:])
    return text[start: start + 1 + nxt.start()] if nxt else text[start:]


def table_fields(section: str) -> set[str]:
    """Names in the first column of the markdown table(s) of a section."""
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE))


# ---------------------------------------------------------------- tensors

TENSORS = [
    np.arange(16, dtype="<f4") / 16,
    np.arange(24, dtype="<i8").reshape(2, 3, 4),
    np.arange(10, dtype="|u1"),
    np.array([True, False, True]),
    np.array([-1, 0, 1], dtype="|i1"),
    np.zeros((0, 5), dtype="<f4"),
    np.linspace(-1, 1, 12, dtype="<f8").reshape(3, 4).T,   # non-contiguous: sent C-order
    np.arange(7, dtype="|u1"),                              # 16-byte payload: fixext 16
    np.full((3, 224, 224), 0.25, dtype="<f4"),             # a float image (chain-cnn's kind)
    np.full((3, 224, 224), 200, dtype="|u1"),              # efficientnet-lite0 input
]


@pytest.mark.parametrize("arr", TENSORS, ids=lambda a: f"{a.dtype.str}{list(a.shape)}")
def test_tensor_ext_layout_is_byte_exact(arr: np.ndarray) -> None:
    ours = msgpack.packb(client_tensor(arr), use_bin_type=True)
    assert pack(arr) == ours
    code, payload = _ext(pack(arr))
    assert code == 1
    dtype_s, shape, data = msgpack.unpackb(payload, raw=False)
    assert dtype_s == arr.dtype.str
    assert shape == list(arr.shape)
    assert isinstance(data, bytes) and data == np.ascontiguousarray(arr).tobytes()
    back = unpack(ours)
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)
    np.testing.assert_array_equal(client_decode(pack(arr)), arr)


def _ext(data: bytes) -> tuple[int, bytes]:
    ext = msgpack.unpackb(data, raw=False)
    assert isinstance(ext, msgpack.ExtType)
    return ext.code, ext.data


def test_ext_header_forms() -> None:
    # README: ext 8 for most tensors, fixext 16 for a 16-byte payload, ext 16 beyond 255 bytes.
    assert pack(np.full(16, 0.5, "<f4"))[:3] == bytes([0xC7, 0x49, 0x01])
    assert pack(np.arange(7, dtype="|u1"))[:2] == bytes([0xD8, 0x01])
    assert pack(np.zeros(100, "<f4"))[:1] == bytes([0xC8])
    assert pack(np.zeros(20000, "<f4"))[:1] == bytes([0xC9])


def test_decoder_accepts_scalar_shape() -> None:
    arr = unpack(msgpack.packb(raw_tensor("<f4", [], np.float32(2.5).tobytes()), use_bin_type=True))
    assert arr.shape == () and float(arr) == 2.5


def test_zero_d_round_trip() -> None:
    assert unpack(pack(np.array(2.5, "<f4"))).shape == ()


# ---------------------------------------------------------------- the request

def test_request_round_trips_into_decode_infer_request() -> None:
    image = np.random.default_rng(0).random((3, 224, 224), dtype=np.float32)
    data = client_request("r-1", "efficientnet-lite0", {"image": image}, slo_ms=120)
    msg = decode_map(data)
    req = decode_infer_request(msg, "efficientnet-lite0")
    assert (req.id, req.model, req.slo_ms) == ("r-1", "efficientnet-lite0", 120.0)
    assert set(req.inputs) == {"image"}
    assert req.inputs["image"].dtype.str == "<f4" and req.inputs["image"].shape == (3, 224, 224)
    np.testing.assert_array_equal(req.inputs["image"], image)
    # The package's own encoder writes the same bytes.
    assert InferRequest("r-1", "efficientnet-lite0", {"image": image}, 120.0).encode() == data
    assert len(data) < 8 * 1024 * 1024


def test_optional_fields_default() -> None:
    data = client_encode({"v": 1, "id": "r-2", "inputs": {"x": np.zeros(16, "<f4")}})
    req = decode_infer_request(decode_map(data), "tiny")
    assert req.model == "tiny" and req.slo_ms is None
    req = decode_infer_request(decode_map(client_encode(
        {"v": 1, "id": "r-3", "inputs": {"x": np.zeros(16, "<f4")}, "slo_ms": None,
         "unknown_field": [1, 2]})), "tiny")
    assert req.slo_ms is None
    req = decode_infer_request(decode_map(client_encode(  # nil means absent: the subject's
        {"v": 1, "id": "r-4", "model": None, "inputs": {"x": np.zeros(16, "<f4")}})), "tiny")
    assert req.model == "tiny"


@pytest.mark.parametrize("where", ["top", "nested", "key"])
def test_a_timestamp_is_refused_like_every_extension_but_tensors(where: str) -> None:
    ts = msgpack.Timestamp(1, 0)  # extension type -1, which msgpack decodes by itself
    msg: dict[Any, Any] = {"v": 1, "id": "r", "inputs": {"x": np.zeros(16, "<f4")}}
    if where == "top":
        msg["unknown_field"] = ts
    elif where == "nested":
        msg["unknown_field"] = [{"when": [ts]}]
    else:
        msg[ts] = 1
    err = assert_bad_request(client_encode(msg))
    assert "extension type -1" in err.message


def _readme_example_bytes() -> bytes:
    text = readme()
    block = text.split("<!-- wire-example:request -->", 1)[1].split("```", 2)[1]
    return bytes.fromhex(" ".join(block.split()))


def test_readme_byte_dump_is_what_both_encoders_write() -> None:
    msg = {"v": 1, "id": "req-1", "model": "tiny", "inputs": {"x": np.full(16, 0.5, "<f4")},
           "slo_ms": 250.0}
    expected = _readme_example_bytes()
    assert len(expected) == 126
    assert client_encode(msg) == expected
    assert pack(msg) == expected
    assert InferRequest("req-1", "tiny", {"x": np.full(16, 0.5, "<f4")}, 250.0).encode() == expected
    req = decode_infer_request(decode_map(expected), "tiny")
    np.testing.assert_array_equal(req.inputs["x"], np.full(16, 0.5, "<f4"))


@pytest.mark.parametrize("change, fragment", [
    ({"id": ""}, "'id'"),
    ({"id": 7}, "'id'"),
    ({"id": None}, "'id'"),
    ({"id": "x" * 257}, "'id' is 257 bytes; at most 256"),
    ({"id": "é" * 129}, "'id' is 258 bytes"),
    ({"model": "other"}, "'model'"),
    ({"inputs": {}}, "'inputs'"),
    ({"inputs": [1, 2]}, "'inputs'"),
    ({"inputs": {"x": [0.0] * 16}}, "tensor"),
    ({"slo_ms": 0}, "slo_ms"),
    ({"slo_ms": -5.0}, "slo_ms"),
    ({"slo_ms": float("inf")}, "slo_ms"),
    ({"slo_ms": float("nan")}, "slo_ms"),
    ({"slo_ms": True}, "slo_ms"),
    ({"slo_ms": "100"}, "slo_ms"),
])
def test_bad_request_fields(change: dict, fragment: str) -> None:
    msg = {"v": 1, "id": "r", "model": "tiny", "inputs": {"x": np.zeros(16, "<f4")}, "slo_ms": 10}
    msg.update(change)
    with pytest.raises(ServingError) as info:
        decode_infer_request(decode_map(client_encode(msg)), "tiny")
    assert info.value.code == errors.BAD_REQUEST
    assert fragment in info.value.message


# ---------------------------------------------------------------- envelope failures

def test_malformed_msgpack() -> None:
    assert_bad_request(b"\xc1")                                 # never-used byte
    assert_bad_request(client_encode({"v": 1, "id": "x"})[:-2])  # truncated
    assert_bad_request(client_encode({"v": 1}) + b"\x01")         # trailing data
    assert_bad_request(b"")
    assert_bad_request(b"\x81\xa1v\x01\xa2id\xa2\xff\xfe")      # invalid UTF-8 in a str


@pytest.mark.parametrize("version", [None, 0, 2, "1", [1]])
def test_wrong_version(version: Any) -> None:
    msg: dict[str, Any] = {"id": "r", "inputs": {"x": np.zeros(16, "<f4")}}
    if version is not None:
        msg["v"] = version
    err = assert_bad_request(client_encode(msg))
    assert "version" in err.message


@pytest.mark.parametrize("body", [[1, "v"], 1, "v", None, b"\x01"])
def test_non_map(body: Any) -> None:
    err = assert_bad_request(msgpack.packb(body, use_bin_type=True))
    assert "map" in err.message


@pytest.mark.parametrize("tensor", [
    raw_tensor("<f4", [16], b"\x00" * 63),                   # one byte short
    raw_tensor("<f4", [16], b"\x00" * 68),                   # one element too many
    raw_tensor("<f4", [2, 8], b""),
    raw_tensor("|O", [1], b"\x00" * 8),                      # object dtype
    raw_tensor("|V8", [1], b"\x00" * 8),                     # void dtype
    raw_tensor("<U1", [1], b"\x00" * 4),                     # unicode dtype
    raw_tensor("<c8", [1], b"\x00" * 8),                     # complex
    raw_tensor("not-a-dtype", [1], b"\x00"),
    raw_tensor("<f4", [-1], b""),                            # negative dim
    raw_tensor("<f4", 4, b"\x00" * 16),                      # shape not a list
    raw_tensor("<f4", [1.0], b"\x00" * 4),                   # float dim
    raw_tensor("<f4", [1], "\x00\x00\x00\x00"),             # data as str, not bin
    raw_tensor("<f4", [1], None),
    msgpack.ExtType(1, msgpack.packb(["<f4", [1]], use_bin_type=True)),   # two elements
    msgpack.ExtType(1, b"\xc1"),                             # payload not msgpack
    msgpack.ExtType(2, client_tensor(np.zeros(1, "<f4")).data),           # unknown ext code
], ids=lambda t: repr(t)[:60])
def test_bad_tensor_payload(tensor: msgpack.ExtType) -> None:
    msg = {"v": 1, "id": "r", "model": "tiny", "inputs": {"x": tensor}}
    assert_bad_request(msgpack.packb(msg, use_bin_type=True))


# ---------------------------------------------------------------- replies

def test_success_reply_fields_and_types() -> None:
    logits = np.linspace(-2, 2, 10, dtype=np.float32)
    data = encode_reply("r-9", "tiny", {"logits": logits}, np.int32(7), np.float32(0.125),
                        np.int32(-1), np.bool_(False), 3.5, np.int64(4))
    reply = client_decode(data)
    assert set(reply) == {"v", "id", "model", "outputs", "label", "score", "exit", "early",
                          "latency_ms", "config_version"}
    assert "error" not in reply
    expect_types = {"v": int, "id": str, "model": str, "outputs": dict, "label": int,
                    "score": float, "exit": int, "early": bool, "latency_ms": float,
                    "config_version": int}
    for key, typ in expect_types.items():
        assert type(reply[key]) is typ, (key, type(reply[key]))
    assert reply["v"] == 1 and reply["id"] == "r-9" and reply["model"] == "tiny"
    assert (reply["label"], reply["score"], reply["exit"], reply["early"]) == (7, 0.125, -1, False)
    assert reply["config_version"] == 4
    out = reply["outputs"]["logits"]
    assert out.dtype.str == "<f4" and out.shape == (10,)
    np.testing.assert_array_equal(out, logits)
    # Floats go out as float64 (0xcb); the same bytes decode with the package's codec.
    assert b"\xa5score\xcb" in data and b"\xaalatency_ms\xcb" in data
    assert set(decode_map(data)) == set(reply)
    # Documented field names match (``variant`` only for models served by variant).
    assert table_fields(readme_section("Success reply")) == set(reply) | {"variant"}
    with_variant = client_decode(encode_reply("r", "sn", {"logits": logits}, 1, 0.5, -1, False,
                                              2.0, 0, variant="D=1,1;W=1,0.5"))
    assert with_variant["variant"] == "D=1,1;W=1,0.5"
    assert set(with_variant) == table_fields(readme_section("Success reply"))


def test_early_reply() -> None:
    reply = client_decode(encode_reply("r", "tiny", {"logits": np.zeros((10,), np.float32)}, 3,
                                       0.01, 2, True, 1.0, 5))
    assert reply["exit"] == 2 and reply["early"] is True


def test_tiny_reply_logits_bytes_as_documented() -> None:
    data = encode_reply("r", "tiny", {"logits": np.zeros(10, np.float32)}, 0, 0.5, -1, False,
                        1.0, 0)
    # README: "93 a3 3c 66 34 91 0a c4 28" + 40 bytes, wrapped as "c7 31 01".
    assert bytes.fromhex("c7 31 01 93 a3 3c 66 34 91 0a c4 28") + b"\x00" * 40 in data


@pytest.mark.parametrize("code", errors.CODES)
def test_error_reply(code: str) -> None:
    extra = {"retry_after_ms": 12.5} if code == errors.OVERLOADED else {}
    reply = client_decode(encode_error("r-1", code, "what went wrong", **extra))
    assert set(reply) == {"v", "id", "error"}
    assert reply["v"] == 1 and reply["id"] == "r-1"
    err = reply["error"]
    assert err["code"] == code and err["message"] == "what went wrong"
    assert isinstance(err["code"], str) and isinstance(err["message"], str)
    if code == errors.OVERLOADED:
        assert type(err["retry_after_ms"]) is float and err["retry_after_ms"] == 12.5
    else:
        assert "retry_after_ms" not in err


def test_error_reply_without_id() -> None:
    data = encode_error(None, errors.BAD_REQUEST, "not msgpack")
    assert client_decode(data) == {"v": 1, "id": None, "error": {"code": "bad_request",
                                                                  "message": "not msgpack"}}
    assert b"\xa2id\xc0" in data    # id is msgpack nil


def test_every_error_code_is_documented() -> None:
    section = readme_section("Error reply")
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE))
    assert documented == set(errors.CODES)


# ---------------------------------------------------------------- model metadata

def test_models_reply_shape() -> None:
    # What Router.on_models builds: spec.describe() + ready, packed with the codec.
    from services.router.model_specs import ModelSpec, TensorContract

    spec = ModelSpec("tiny", (TensorContract("x", "<f4", (16,)),),
                     (TensorContract("logits", "<f4", (10,)),), 10, 1.0)
    data = pack({"v": 1, "models": [dict(spec.describe(), ready=True)]})
    reply = client_decode(data)
    model = reply["models"][0]
    assert set(model) == {"name", "ready", "inputs", "outputs", "classes"}
    assert model["inputs"] == [{"name": "x", "dtype": "<f4", "shape": [16]}]
    assert model["outputs"] == [{"name": "logits", "dtype": "<f4", "shape": [10]}]
    assert model["classes"] == 10 and model["ready"] is True
    # The request the README tells a client to build from this metadata passes the router check.
    x = model["inputs"][0]
    req = decode_infer_request(decode_map(client_request(
        "r", "tiny", {x["name"]: np.zeros(x["shape"], x["dtype"])})), "tiny")
    spec.check_inputs(req.inputs)
    with pytest.raises(ServingError) as info:     # a batch axis is refused
        spec.check_inputs({"x": np.zeros((1, 16), "<f4")})
    assert info.value.code == errors.BAD_REQUEST


# ---------------------------------------------------------------- subjects and internals

def test_every_subject_is_documented() -> None:
    text = readme()
    names = [subjects.MODELS, subjects.STATUS_ROUTER, subjects.STATUS_MONITOR, subjects.HEARTBEAT,
             subjects.TELEMETRY_STREAM, subjects.TELEMETRY_ALL, subjects.ROUTER_QUEUE,
             subjects.MONITOR_DURABLE, subjects.infer("<model>"), subjects.work("<worker_id>"),
             subjects.stage("<model>", "<block>"),  # type: ignore[arg-type]
             subjects.stage_queue("<model>", "<block>"),  # type: ignore[arg-type]
             subjects.results("<router_id>"), subjects.exit_config("<model>"),
             subjects.telemetry_samples("<model>"), subjects.telemetry_requests("<model>"),
             subjects.ramp_features("<model>"), subjects.plan("<model>"),
             subjects.telemetry_generation("<model>"), subjects.helios_decision("<model>"),
             subjects.helios_breach("<model>")]
    missing = [n for n in names if f"`{n}`" not in text]
    assert not missing, missing
    assert subjects.INFER_ALL == "offramp.infer.*" and "`offramp.infer.*`" in text


def test_batch_fields() -> None:
    n = 3
    batch = Batch("abc123def456", "tiny", 1, subjects.results("router-0000abcd"), ["a", "b", "c"],
                  2, {"x": np.zeros((n, 32), np.float32)}, [0],
                  np.zeros((1, n), np.int32), np.zeros((1, n), np.float32),
                  np.array([-1, 0, -1], np.int32), [0.5])
    msg = client_decode(batch.encode())
    assert set(msg) - {"v"} == table_fields(readme_section("Batch"))
    assert msg["router"] == "offramp.results.router-0000abcd"
    assert msg["inputs"]["x"].shape == (n, 32)
    assert msg["ramp_pred"].dtype.str == "<i4" and msg["exit_at"].dtype.str == "<i4"
    # From the router: nil ramp records.
    first = client_decode(Batch("b", "tiny", 0, "offramp.results.r", ["a"], 0,
                                {"x": np.zeros((1, 16), np.float32)}).encode())
    assert first["ramp_pred"] is None and first["exit_at"] is None and first["ramp_ids"] == []
    assert Batch.decode(decode_map(batch.encode())).ids == ["a", "b", "c"]
    assert first["variant"] is None and Batch.decode(decode_map(batch.encode())).variant is None
    chosen = Batch("b", "sn", 0, "offramp.results.r", ["a"], 0,
                   {"image": np.zeros((1, 3), np.float32)}, variant="D=1;W=0.5")
    assert Batch.decode(decode_map(chosen.encode())).variant == "D=1;W=0.5"
    for bad in ("", 5, "x" * 201):
        msg = decode_map(chosen.encode())
        msg["variant"] = bad
        with pytest.raises(ServingError, match="'variant'"):
            Batch.decode(msg)


def test_results_fields() -> None:
    res = Results("b", "tiny-s0-abcdef", 0, ["a"], np.array([3], np.int32),
                  np.array([0.1], np.float32), np.array([1], np.int32),
                  np.zeros((1, 10), np.float32), True, 2)
    msg = client_decode(res.encode())
    assert set(msg) - {"v"} == table_fields(readme_section("Results"))
    assert msg["early"] is True and msg["release"] is False and msg["error"] is None
    assert msg["logits"].shape == (1, 10)
    assert msg["variant"] is None


def test_exit_config_int_keys() -> None:
    cfg = ExitConfig("tiny", 3, thresholds={0: 0.2, 2: 0.05}, active=[0, 2])
    data = cfg.encode()
    msg = client_decode(data)
    assert set(msg) - {"v"} == table_fields(readme_section("ExitConfig"))
    assert msg["thresholds"] == {0: 0.2, 2: 0.05}
    assert all(type(k) is int for k in msg["thresholds"])
    assert (msg["mode"], msg["score"], msg["active"], msg["version"]) == ("latency", "max_softmax",
                                                                         [0, 2], 3)
    assert ExitConfig.decode(decode_map(data)) == cfg


def test_exit_config_heads_round_trip_and_bad_names_are_refused() -> None:
    cfg = ExitConfig("tiny", 4, thresholds={0: 0.1}, active=[0],
                     heads={0: "ramp_0.v2.0123456789ab.onnx"})
    msg = client_decode(cfg.encode())
    assert msg["heads"] == {0: "ramp_0.v2.0123456789ab.onnx"}
    assert ExitConfig.decode(decode_map(cfg.encode())) == cfg
    assert ExitConfig.decode({**msg, "heads": None}).heads == {}
    for bad in ("../ramp_0.onnx", "/etc/passwd.onnx", ".hidden.onnx", "ramp_0.v2.txt", 7,
                "a\\b.onnx"):
        assert_refused(ExitConfig.decode, {**msg, "heads": {0: bad}}, "malformed exit config")


@pytest.mark.parametrize("change, fragment", [
    ({"score": "bogus"}, "unknown score kind 'bogus'"),
    ({"mode": "turbo"}, "unknown mode 'turbo'"),
    ({"version": -1}, "version must be >= 0"),
    ({"version": "7"}, "'version' must be"),
    ({"model": ""}, "model name is empty"),
    ({"model": None}, "'model' is missing"),
    ({"thresholds": {0: 1.5}}, "threshold of ramp 0 must be in [0, 1]"),
    ({"thresholds": {0: -0.1}}, "threshold of ramp 0 must be in [0, 1]"),
    ({"thresholds": {0: float("nan")}}, "threshold of ramp 0 must be in [0, 1]"),
    ({"thresholds": {0: "0.1"}}, "'thresholds' must be a map of integer keys"),
    ({"thresholds": {"0": 0.1}}, "'thresholds' must be a map of integer keys"),
    ({"active": [0, 0]}, "active ramps must be distinct"),
    ({"active": [3]}, "active ramps [3] have no threshold"),
    ({"active": "0"}, "'active' must be an array"),
    ({"heads": {"0": "ramp_0.onnx"}}, "'heads' must be a map of ramp indices"),
    ({"heads": [1]}, "'heads' must be a map of ramp indices"),
])
def test_exit_configs_a_worker_cannot_serve_are_refused(change: dict, fragment: str) -> None:
    msg = client_decode(ExitConfig("tiny", 3, thresholds={0: 0.2, 2: 0.0}, active=[0]).encode())
    assert_refused(ExitConfig.decode, {**msg, **change}, "malformed exit config", fragment)


def ramp_features(n: int = 3, logits: bool = True) -> RampFeatures:
    rng = np.random.default_rng(0)
    return RampFeatures(
        model="tiny", worker="tiny-s0-abcdef", config_version=5,
        ids=[f"r{i}" for i in range(n)], ramp_ids=[0, 2],
        features=[rng.random((n, 4), np.float32), rng.random((n, 8), np.float32)],
        final_pred=np.arange(n, dtype=np.int32),
        final_logits=rng.random((n, 10), np.float32) if logits else None, t=1.5)


def test_ramp_features_fields_round_trip() -> None:
    feats = ramp_features()
    msg = client_decode(feats.encode())
    assert set(msg) - {"v"} == table_fields(readme_section("Ramp features"))
    back = RampFeatures.decode(decode_map(feats.encode()))
    assert back.ids == feats.ids and back.ramp_ids == [0, 2]
    for a, b in zip(back.features, feats.features, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(back.final_logits, feats.final_logits)
    assert RampFeatures.decode(decode_map(ramp_features(logits=False).encode())).final_logits is None


@pytest.mark.parametrize("change, fragment", [
    ({"features": [np.zeros((3, 4), np.float32)]}, "2 ramp_ids but 1 feature tensors"),
    ({"features": [np.zeros((2, 4), np.float32), np.zeros((3, 8), np.float32)]}, "[3, C]"),
    ({"features": [np.zeros((3, 4), np.int32), np.zeros((3, 8), np.float32)]}, "floats"),
    ({"features": [[1.0], np.zeros((3, 8), np.float32)]}, "tensor"),
    ({"final_logits": np.zeros((2, 10), np.float32)}, "final_logits"),
    ({"final_pred": np.zeros(3, np.float32)}, "final_pred"),
    ({"ids": None}, "'ids'"),
])
def test_ramp_features_refuse_malformed_input(change: dict, fragment: str) -> None:
    msg = {**decode_map(ramp_features().encode()), **change}
    assert_refused(RampFeatures.decode, msg, "ramp features", fragment)


def test_batch_and_results_refuse_malformed_input() -> None:
    good = client_decode(Results("b", "w", 0, [], np.zeros(0, np.int32), np.zeros(0, np.float32),
                                 np.zeros(0, np.int32), None, False, 1, release=True).encode())
    for cls, msg in ((Results, good), (Batch, {"v": 1, "batch_id": "b", "model": "tiny"}),
                     (ExitConfig, {"v": 1, "model": "tiny", "version": "x"})):
        broken = {k: v for k, v in msg.items() if k != "worker"}
        with pytest.raises(ServingError) as info:
            cls.decode(broken)
        assert info.value.code == errors.BAD_REQUEST and "malformed" in info.value.message


def test_error_results_carry_a_documented_code() -> None:
    res = Results("b", "w", 0, ["a"], np.zeros(0), np.zeros(0), np.zeros(0), None, False, 1,
                  release=True, error={"code": errors.PAYLOAD_TOO_LARGE, "message": "too big"})
    back = Results.decode(decode_map(res.encode()))
    assert back.error == {"code": "payload_too_large", "message": "too big"} and back.release
    section = readme_section("Results")
    assert f'"{errors.PAYLOAD_TOO_LARGE}"' in section and f'"{errors.INTERNAL}"' in section


# ---------------------------------------------------------------- typed internal messages
# Each is checked like the client messages: the README's table lists exactly the fields the
# class writes, in the order it writes them (a client encoding the documented map writes
# the same bytes), the decoder returns what was encoded, and malformed input is refused
# with a bad_request that names the message and the field.


def table_order(section: str) -> list[str]:
    return re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE)


def documented_bytes(section: str, values: dict[str, Any]) -> bytes:
    """The message a client writes from the README: ``"v": 1`` then the table's fields."""
    return client_encode({"v": 1, **{name: values[name] for name in table_order(section)}})


def assert_refused(decode: Any, msg: Any, *fragments: str) -> None:
    with pytest.raises(ServingError) as info:
        decode(msg)
    assert info.value.code == errors.BAD_REQUEST
    for fragment in fragments:
        assert fragment in info.value.message, (fragment, info.value.message)


HEARTBEAT = Heartbeat(worker="tiny-s1-abcdef", model="tiny", stage=1, stages=2, capacity=2,
                      first_block=2, last_block=4, pid=4321, host="node-1", busy=True, queued=3,
                      batches=17, set_aside=1, gave_way=5, late=2, config_version=6,
                      t=1700000000.25, held=("b-1", "b-2"), pool="pool-node-1-4321-ab12",
                      ran=3, ran_rows=40, ran_ms=61.5)


def test_heartbeat_fields_round_trip_and_bytes() -> None:
    data = HEARTBEAT.encode()
    msg = client_decode(data)
    section = readme_section("Heartbeat")
    assert list(msg) == ["v", *table_order(section)]
    types = {"worker": str, "model": str, "host": str, "busy": bool, "t": float, "held": list,
             "pool": str, "ran_ms": float, "llm": bool}
    for name, value in msg.items():
        assert type(value) is types.get(name, int), name
    assert data == documented_bytes(section, msg)
    assert Heartbeat.decode(decode_map(data)) == HEARTBEAT


def test_heartbeat_needs_only_the_routing_fields() -> None:
    hb = Heartbeat.decode(decode_map(client_encode(
        {"v": 1, "worker": "w", "model": "tiny", "stage": 0, "stages": 1, "capacity": 2,
         "pid": None, "unknown_field": 1})))
    assert hb == Heartbeat("w", "tiny", 0, 1, 2)
    assert (hb.pid, hb.host, hb.busy, hb.config_version, hb.t) == (0, "", False, 0, 0.0)
    assert hb.held is None  # unknown: the router takes back nothing on its word


@pytest.mark.parametrize("change, field", [
    ({"worker": None}, "'worker'"),
    ({"model": None}, "'model'"),
    ({"stage": None}, "'stage'"),
    ({"stages": None}, "'stages'"),
    ({"capacity": None}, "'capacity'"),
    ({"worker": 7}, "'worker'"),
    ({"stage": "1"}, "'stage'"),
    ({"stage": True}, "'stage'"),
    ({"capacity": 1.5}, "'capacity'"),
    ({"busy": 1}, "'busy'"),
    ({"t": "now"}, "'t'"),
    ({"held": "b-1"}, "held"),
    ({"held": [1, 2]}, "held"),
])
def test_malformed_heartbeat_is_refused(change: dict, field: str) -> None:
    msg = client_decode(HEARTBEAT.encode())
    msg.update(change)
    assert_refused(Heartbeat.decode, {k: v for k, v in msg.items() if v is not None},
                   "heartbeat", field)


def sample_telemetry() -> SampleTelemetry:
    return SampleTelemetry(
        model="tiny", worker="tiny-s1-abcdef", batch_id="b2", batch_ids=["b1", "b2"],
        batch_sizes=[2, 1], config_version=4, mode="latency", score="max_softmax",
        thresholds={0: 0.2, 2: 0.05}, active=[0, 2], ids=["r1", "r2", "r3"], ramp_ids=[0, 2],
        ramp_pred=np.array([[1, 2, 3], [1, 5, 3]], np.int32),
        ramp_score=np.array([[0.1, 0.5, 0.3], [0.01, 0.4, 0.2]], np.float32),
        exit_at=np.array([0, -1, -1], np.int32), final_pred=np.array([1, 4, 3], np.int32),
        final_score=np.array([0.0, 0.3, 0.1], np.float32), batch_size=3,
        stage_ms=[[0.5, 0.25], [0.75, 0.5]], t=1700000000.5)


def test_sample_telemetry_fields_round_trip_and_bytes() -> None:
    tel = sample_telemetry()
    data = tel.encode()
    msg = client_decode(data)
    section = readme_section("Sample telemetry")
    assert list(msg) == ["v", *table_order(section)]
    for name in ("ramp_pred", "ramp_score"):
        assert msg[name].shape == (2, 3), name                    # [R, N]
    for name in ("exit_at", "final_pred", "final_score"):
        assert msg[name].shape == (3,), name                      # [N]
    assert {k: msg[k].dtype.str for k in ("ramp_pred", "ramp_score", "exit_at", "final_pred",
                                          "final_score")} == {
        "ramp_pred": "<i4", "ramp_score": "<f4", "exit_at": "<i4", "final_pred": "<i4",
        "final_score": "<f4"}
    assert msg["thresholds"] == {0: 0.2, 2: 0.05} and all(type(k) is int for k in msg["thresholds"])
    assert msg["stage_ms"] == [[0.5, 0.25], [0.75, 0.5]] and type(msg["t"]) is float
    assert data == documented_bytes(section, msg)
    back = SampleTelemetry.decode(decode_map(data))
    for name in table_order(section):
        want, got = getattr(tel, name), getattr(back, name)
        if isinstance(want, np.ndarray):
            assert got.dtype == want.dtype, name
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            assert got == want, name


@pytest.mark.parametrize("field", table_order(readme_section("Sample telemetry")))
def test_sample_telemetry_without_a_field_is_refused(field: str) -> None:
    msg = client_decode(sample_telemetry().encode())
    del msg[field]
    assert_refused(SampleTelemetry.decode, msg, "sample telemetry", f"'{field}'")


@pytest.mark.parametrize("change, fragments", [
    ({"ramp_pred": np.zeros((2, 2), np.int32)}, ("'ramp_pred'", "shape")),
    ({"ramp_score": np.zeros((1, 3), np.float32)}, ("'ramp_score'", "shape")),
    ({"exit_at": np.zeros(3, np.float32)}, ("'exit_at'", "integers")),
    ({"ramp_score": np.zeros((2, 3), np.int32)}, ("'ramp_score'", "floats")),
    ({"final_pred": [1, 4, 3]}, ("'final_pred'", "tensor")),
    ({"ids": ["r1", "r2"]}, ("batch_size",)),
    ({"batch_ids": ["b2"]}, ("batch_ids",)),
    ({"thresholds": {"0": 0.2}}, ("'thresholds'",)),
    ({"stage_ms": [0.5, 0.25]}, ("'stage_ms'",)),
    ({"config_version": "4"}, ("'config_version'",)),
])
def test_malformed_sample_telemetry_is_refused(change: dict, fragments: tuple) -> None:
    msg = client_decode(sample_telemetry().encode())
    msg.update(change)
    assert_refused(SampleTelemetry.decode, msg, "sample telemetry", *fragments)
    assert_refused(SampleTelemetry.decode, [1, 2], "sample telemetry", "map")


REQUESTS = RequestTelemetry("tiny", "router-1a2b3c4d", [
    RequestRecord("r1", 1700000000.5, 3.25, OK, 2, True, 7, 4),
    RequestRecord(None, 1700000001.0, 0.5, errors.BAD_REQUEST),
])


def test_request_telemetry_fields_round_trip_and_bytes() -> None:
    data = REQUESTS.encode()
    msg = client_decode(data)
    section, record = readme_section("Request telemetry"), readme_section("Request record")
    assert list(msg) == ["v", *table_order(section)]
    ok, refused = msg["records"]
    assert list(ok) == list(refused) == [f for f in table_order(record) if f != "variant"]
    assert ok == {"id": "r1", "t": 1700000000.5, "latency_ms": 3.25, "status": "ok", "exit": 2,
                  "early": True, "label": 7, "config_version": 4}
    assert refused == {"id": None, "t": 1700000001.0, "latency_ms": 0.5, "status": "bad_request",
                       "exit": None, "early": None, "label": None, "config_version": None}
    assert data == client_encode({"v": 1, "model": "tiny", "router": "router-1a2b3c4d",
                                  "records": [{k: r[k] for k in table_order(record)
                                               if k != "variant"} for r in (ok, refused)]})
    assert RequestTelemetry.decode(decode_map(data)) == REQUESTS
    bare = RequestTelemetry.decode({"v": 1, "model": "tiny", "router": "r", "records": [
        {"t": 1.0, "latency_ms": 2.0, "status": "ok"}]})
    assert bare.records == [RequestRecord(None, 1.0, 2.0, OK)]    # absent = nil
    served = RequestTelemetry("sn", "r", [RequestRecord("a", 1.0, 2.0, OK, -1, False, 3, 0,
                                                        "D=1;W=1")])
    assert RequestTelemetry.decode(decode_map(served.encode())) == served
    assert client_decode(served.encode())["records"][0]["variant"] == "D=1;W=1"


@pytest.mark.parametrize("change, fragments", [
    ({"records": None}, ("'records'", "missing")),
    ({"records": {"id": "r"}}, ("'records'", "array")),
    ({"records": [["r", 1.0]]}, ("'records'", "maps")),
    ({"router": 5}, ("'router'",)),
    ({"records": [{"id": "r", "latency_ms": 1.0, "status": "ok"}]}, ("record 0", "'t'")),
    ({"records": [{"t": 1.0, "latency_ms": 1.0, "status": 0}]}, ("record 0", "'status'")),
    ({"records": [{"t": 1.0, "latency_ms": 1.0, "status": "ok", "early": "yes"}]},
     ("record 0", "'early'")),
    ({"records": [{"t": 1.0, "latency_ms": 1.0, "status": "ok", "label": 1.5}]},
     ("record 0", "'label'")),
])
def test_malformed_request_telemetry_is_refused(change: dict, fragments: tuple) -> None:
    msg = client_decode(REQUESTS.encode())
    msg.update(change)
    msg = {k: v for k, v in msg.items() if v is not None}
    assert_refused(RequestTelemetry.decode, msg, "request telemetry", *fragments)


def test_deployment_plan_fields() -> None:
    from schemas.plans import Plan, StageRole

    plan = Plan("m", 2, "timer", True, 4, (StageRole(0, 0, 4, "cpu-2c", 16, 200.0, (1,),
                                                     ("pool-a",)),), 10.0, 50.0, 3.0, t=1.0)
    msg = client_decode(plan.encode())
    assert set(msg) - {"v"} == table_fields(readme_section("Deployment plan"))
    section = readme_section("Deployment plan")
    assert all(f"`{k}`" in section for k in msg["stages"][0])
    assert Plan.decode(msg) == plan


# ---------------------------------------------------------------- HELIOS

GENERATIONS = GenerationTelemetry("chat", "chat-s0-abcdef", [
    GenerationRecord("g-1", 1700000000.5, "opt-1.3b", 12, 3, 7, 5, 40.0, 20.0, 120.0, -2.5,
                     {6: 3, 12: 2}, [1, 4], 3_000_000_000, judged_logprob=-3.75,
                     decode_ms=96.5),
    GenerationRecord("g-2", 1700000001.0, "opt-1.3b", 12, None, 4, 1, 35.0, 0.0, 35.0, -0.25,
                     {12: 1}, [], 2_900_000_000, judging=True),
])


def test_generation_telemetry_fields_round_trip_and_bytes() -> None:
    data = GENERATIONS.encode()
    msg = client_decode(data)
    section, record = readme_section("Generation telemetry"), readme_section("Generation record")
    assert list(msg) == ["v", *table_order(section)]
    assert all(list(r) == table_order(record) for r in msg["records"])
    assert msg["records"][0]["exits"] == {6: 3, 12: 2}  # int keys, as documented
    assert msg["records"][1]["assessment"] is None
    assert data == documented_bytes(section, {**msg, "records": [
        {k: r[k] for k in table_order(record)} for r in msg["records"]]})
    assert GenerationTelemetry.decode(decode_map(data)) == GENERATIONS
    bare = {k: v for k, v in msg["records"][1].items()
            if k not in ("assessment", "judging", "decode_ms")}
    assert GenerationRecord.from_map(bare, 0).assessment is None  # absent = nil
    assert GenerationRecord.from_map(bare, 0).decode_ms is None  # absent = nil
    assert not GenerationRecord.from_map(bare, 0).judging  # absent = false
    assert GENERATIONS.records[0].completes and not GENERATIONS.records[1].completes


@pytest.mark.parametrize("change, fragments", [
    ({"exits": {6: 3, 12: 1}}, ("must count the 5 tokens",)),
    ({"breach_at": [5]}, ("must index the 5 tokens",)),
    ({"tokens": None}, ("'tokens'",)),
    ({"memory_bytes": None}, ("'memory_bytes'",)),
    ({"decode_ms": -1.0}, ("decode_ms -1.0 must be >= 0",)),
])
def test_malformed_generation_telemetry_is_refused(change: dict, fragments: tuple) -> None:
    msg = client_decode(GENERATIONS.encode())
    rec = {k: v for k, v in {**msg["records"][0], **change}.items() if v is not None}
    assert_refused(GenerationTelemetry.decode, {**msg, "records": [rec]},
                   "generation record 0", *fragments)


def test_helios_decision_fields_round_trip_and_bytes() -> None:
    choice = HeliosChoice("chat", 42, "load", "opt-1.3b", 24, 3, 0.8)
    data = choice.encode()
    msg = client_decode(data)
    section = readme_section("HELIOS decision")
    assert list(msg) == ["v", *table_order(section)]
    assert data == documented_bytes(section, msg)
    assert HeliosChoice.decode(decode_map(data)) == choice
    for kind in ("evaluate", "load", "unload", "switch", "stay"):
        assert f"`{kind}`" in section
    bare = {k: v for k, v in msg.items() if k not in ("assessment", "threshold")}
    assert HeliosChoice.decode(bare) == HeliosChoice("chat", 42, "load", "opt-1.3b", 24, None)


@pytest.mark.parametrize("change, fragment", [
    ({"kind": "guess"}, "kind 'guess'"),
    ({"depth": 0}, "depth must be >= 1"),
    ({"threshold": 1.5}, "threshold must be in [0, 1]"),
    ({"decision": "7"}, "'decision'"),
])
def test_malformed_helios_decision_is_refused(change: dict, fragment: str) -> None:
    msg = client_decode(HeliosChoice("chat", 42, "stay", "opt-1.3b", 24, 3).encode())
    assert_refused(HeliosChoice.decode, {**msg, **change}, "HELIOS decision", fragment)


def test_confidence_breach_fields_round_trip_and_bytes() -> None:
    alert = BreachAlert("chat", 42, "opt-1.3b", 6, 9, 64)
    data = alert.encode()
    msg = client_decode(data)
    section = readme_section("Confidence breach")
    assert list(msg) == ["v", *table_order(section)]
    assert data == documented_bytes(section, msg)
    assert BreachAlert.decode(decode_map(data)) == alert
    assert_refused(BreachAlert.decode, {**msg, "breaches": 1.5}, "confidence breach",
                   "'breaches'")

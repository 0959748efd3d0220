"""ONNX Runtime sessions for one stage (a contiguous block range) of a prepared model."""

from __future__ import annotations

import itertools
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from schemas.messages import plain_head_file
from services.common.config import ORT_SPIN_SETTINGS
from services.runtime import tap_library, taps
from services.runtime.devices import CPU, CUDA, pick_providers
from services.runtime.manifest import Manifest
from services.runtime.onnx_blocks import add_outputs, assemble, features_name, with_head
from services.runtime.pooling import pool_np, pool_of_arch
from services.runtime.taps import run_with_taps

# Tapped sessions a stage keeps: enough for the tuner's trials to come back to the sets it
# just left (add a ramp, drop it, re-tune) without a rebuild, bounded in memory.
TAPPED_SESSIONS_KEPT = 8
# ONNX Runtime's input type names -> numpy dtypes (inputs of other types get float32).
ORT_DTYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
              "tensor(float16)": np.float16, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
              "tensor(bool)": np.bool_}
_UNBUILT = object()


def spin_for(setting: str, workers_on_host: int | None) -> bool:
    """Whether a worker's intra-op threads spin-wait between operators (``OFFRAMP_ORT_SPIN``,
    default ``off``); only the stage's run without ramps ever spins (``StageRuntime``).

    Spinning saves the wake-up of a sleeping thread at every parallel operator, which pays
    for a lone worker serving one request at a time. Under open-loop arrivals it does not:
    requests arriving mid-run need the cores for their transport, and a spinning pool steals
    the cores other compute processes need (docs/design/spinning-and-inline.md). ``auto``
    spins only when this worker is the host's only one, which the supervisor knows
    (``workers_on_host``); a worker started on its own (compose) does not."""
    if setting not in ORT_SPIN_SETTINGS:
        raise ValueError(f"unknown ORT spin setting {setting!r}; "
                         f"use {', '.join(ORT_SPIN_SETTINGS)}")
    if setting == "auto":
        return workers_on_host == 1
    return setting == "on"


def session_options(threads: int = 0, spin: bool = False) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads > 0:
        so.intra_op_num_threads = threads
    so.log_severity_level = 3  # errors only: keep service logs readable
    # Off by default: threads spin-waiting between operators steal the cores the router,
    # NATS and other stages need on a small machine (see spin_for). Measurements (prepare,
    # profiler) keep it off: they alternate between sessions, whose pools would contend.
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    # Spinning stops the moment a run returns (else the pool spins on into the idle time
    # between requests, burning the cores the answer's path needs), and resumes at the next.
    so.add_session_config_entry("session.force_spinning_stop", "1")
    return so


def block_ranges(first: int, last: int, cut_after: set[int]) -> list[tuple[int, int]]:
    """Blocks [first, last) as contiguous ranges ending after every block in ``cut_after``
    (the blocks followed by an active ramp): each range runs as one session."""
    cuts = sorted(b + 1 for b in cut_after if first <= b < last - 1)
    bounds = [first, *cuts, last]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def active_in_order(ramps, active) -> tuple[int, ...]:
    """The ramps (specs) that ``active`` names, as indices in site order: the order their
    exits are decided in, and the key of a tapped stage."""
    want = set(active)
    return tuple(r.index for r in sorted(ramps, key=lambda r: (r.after_block, r.index))
                 if r.index in want)


def ramps_after_blocks(ramps, active) -> dict[int, list[int]]:
    """Block -> the active ramps sited after it, in site order: where a split stage cuts
    (the first ramp's head rides in the range before the cut, the others run apart)."""
    out: dict[int, list[int]] = {}
    for r in sorted(ramps, key=lambda r: (r.after_block, r.index)):
        if r.index in active:
            out.setdefault(r.after_block, []).append(r.index)
    return out


def as_numpy(x: np.ndarray | ort.OrtValue) -> np.ndarray:
    """A stage output as numpy (``run_range`` keeps activations in ONNX Runtime)."""
    return x.numpy() if isinstance(x, ort.OrtValue) else x


@dataclass(frozen=True)
class _TapStage:
    data: bytes                   # the assembled stage, serialized
    facts: object                 # taps.StageFacts
    names: list[frozenset[str]]   # node names per block (and their outputs', see _node_names)


@dataclass(frozen=True)
class _Layout:
    """What a built session outputs after the activation: the fused head's logits (at 1),
    or ``taps`` tap outcomes; then pooled features as (output, ramp, the pooling still to do
    in numpy, or None: pooled in the graph)."""

    logits: bool = False
    taps: int = 0
    features: tuple[tuple[int, int, str | None], ...] = ()


_PLAIN = _Layout()
# a tapped session: (active ramps in site order, their head files, with features)
TapKey = tuple[tuple[int, ...], tuple[str, ...], bool]
# a merged range: (start, end, fused ramp, its head file, with features)
MergeKey = tuple[int, int, int | None, str | None, bool]


def _node_names(block) -> set[str]:
    """What a block's nodes may be called in a runtime profile: their names, and their
    output tensors' (the names ONNX Runtime's NCHWc transformer derives for the nodes it
    rewrites)."""
    return {n.name for n in block.graph.node} | {o for n in block.graph.node for o in n.output}


class StageRuntime:
    """Blocks [first_block, last_block) and the ramps after them, one session each."""

    def __init__(
        self,
        model_dir: Path,
        manifest: Manifest,
        first_block: int,
        last_block: int,
        device: str = "auto",
        threads: int = 0,
        use_taps: bool = True,
        spin: bool = False,
    ) -> None:
        if not 0 <= first_block < last_block <= manifest.num_blocks:
            raise ValueError(
                f"bad block range [{first_block}, {last_block}) for "
                f"{manifest.name} with {manifest.num_blocks} blocks"
            )
        self.model_dir = Path(model_dir)
        self.manifest = manifest
        self.first_block = first_block
        self.last_block = last_block
        so = session_options(threads, spin)
        # A run with active ramps answers mid-way (latency mode): its early results must
        # leave through the event loop, NATS and the client while the rest of the stage
        # computes, and a spinning pool takes the cores they need. So only the session of
        # the whole stage without ramps spins (when ``spin``); split ranges, heads and
        # tapped stages never do (docs/design/spinning-and-inline.md).
        quiet = session_options(threads, False)
        wanted = pick_providers(device)

        def load(file: str, opts: ort.SessionOptions) -> ort.InferenceSession:
            return ort.InferenceSession(str(self.model_dir / file), opts, providers=wanted)

        single = last_block - first_block == 1  # its one block is the whole stage
        self._blocks = {b.index: load(b.file, so if single else quiet)
                        for b in manifest.blocks[first_block:last_block]}
        self._so, self._quiet, self._providers = so, quiet, wanted
        self._out_device = "cuda" if wanted[0] == CUDA else "cpu"
        self._merged: dict[MergeKey, ort.InferenceSession] = {}
        # At most TAPPED_SESSIONS_KEPT, the least recently used out: each holds its own copy
        # of the stage's weights (~100 MB for MiniLM), and a tuner adapting for days visits
        # ever more ramp sets.
        self._tapped: dict[TapKey, ort.InferenceSession | None] = {}
        self._tap_used: dict[TapKey, int] = {}
        self._uses = itertools.count()
        self._tap_base: _TapStage | None = None
        # session -> input names, _Layout; weak: a batch still running on a dropped session
        self._inputs, self._layouts = weakref.WeakKeyDictionary(), weakref.WeakKeyDictionary()
        self.use_taps = use_taps
        self.threads = threads
        self.tap_notes: list[str] = []  # why a set of ramps splits instead (for logs)
        self._merge_lock = threading.Lock()
        self._local = threading.local()  # this thread's RunOptions (see interruptible)
        self.ramps = manifest.ramps_in(first_block, last_block)
        self._load = lambda file: load(file, quiet)
        self._heads = {(r.index, r.file): load(r.file, quiet) for r in self.ramps}  # + refits
        self._prepared = {r.index: r.file for r in self.ramps}
        self._checked = set(self._prepared.values())  # head file names known to be good
        self._in_dtypes = {t.name: np.dtype(t.dtype) for t in manifest.inputs}
        first = next(iter(self._blocks.values()))
        self.providers: list[str] = list(first.get_providers())

    @property
    def is_last(self) -> bool:
        return self.last_block == self.manifest.num_blocks

    @contextmanager
    def interruptible(self) -> Iterator[ort.RunOptions]:
        """Every runtime call this thread makes inside the block runs with the yielded
        RunOptions: setting its ``terminate`` (from any thread) stops the call in progress
        before its next operator, with an error, and fails every later one at once."""
        ro = ort.RunOptions()
        self._local.ro = ro
        try:
            yield ro
        finally:
            self._local.ro = None

    def _ro(self) -> ort.RunOptions | None:
        return getattr(self._local, "ro", None)

    def run_block(self, i: int, x: dict[str, np.ndarray] | np.ndarray,
                  model_inputs: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Output of block ``i``. Block 0 takes the model inputs (a dict, or one array for a
        single-input model); block k > 0 takes the previous activation ``x`` plus whatever
        model inputs it reads, looked up in ``model_inputs``."""
        spec = self.manifest.blocks[i]
        sess = self._blocks[i]
        if i == 0:
            if not isinstance(x, dict):
                if len(spec.input_names) != 1:
                    raise ValueError(f"block 0 needs a dict of inputs {spec.input_names}")
                x = {spec.input_names[0]: x}
            feeds = {k: self._model_input(k, x) for k in spec.input_names}
        else:
            act = x["x"] if isinstance(x, dict) else x
            feeds = {spec.input_names[0]: np.ascontiguousarray(act, dtype=np.float32)}
            for k in spec.input_names[1:]:
                if model_inputs is None or k not in model_inputs:
                    raise ValueError(f"block {i} of {self.manifest.name} also reads model "
                                     f"input {k!r}: pass it in model_inputs")
                feeds[k] = self._model_input(k, model_inputs)
        return sess.run(None, feeds, self._ro())[0]

    def _model_input(self, name: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return np.ascontiguousarray(inputs[name], dtype=self._in_dtypes.get(name, np.float32))

    def run_range(self, start: int, end: int, x: dict[str, np.ndarray] | np.ndarray | ort.OrtValue,
                  model_inputs: dict[str, np.ndarray] | None = None,
                  ramp: int | None = None, heads: Mapping[int, str] | None = None,
                  features: dict[int, np.ndarray] | None = None
                  ) -> tuple[ort.OrtValue, np.ndarray | None]:
        """Blocks [start, end), plus the head of ``ramp`` (sited after block ``end - 1``; its
        file as ``heads`` names it, see ``head_file``), as one ONNX Runtime call:
        (activation, ramp logits or None). ``features``: a dict that gets the pooled
        features (float32 [batch, dim]) of every ramp sited in the range, from the same call.

        A stage runs the blocks between two active ramps in one call instead of one per
        block, and the ramp head rides along in the same graph. The activation stays an
        ``OrtValue`` (in ONNX Runtime's memory, on the GPU when there is one) from one
        range to the next: copying it out to numpy at every split costs a large share of a
        split stage's time. Call ``as_numpy`` on the stage's final output."""
        sess = self._range(start, end, ramp, heads, features is not None)
        out = self._run(sess, f"blocks {start}..{end - 1}", x, model_inputs,
                        keep=end < self.last_block)
        layout = self._layouts.get(sess, _PLAIN)
        if features is not None:
            self._collect(out, layout, features, x, model_inputs)
        if ramp is None:
            return out[0], None
        if not layout.logits:  # the head could not be fused (see merged): run it on its own
            return out[0], self.run_ramp(ramp, as_numpy(out[0]), model_inputs, heads)
        return out[0], as_numpy(out[1])

    def _range(self, start: int, end: int, ramp: int | None, heads: Mapping[int, str] | None,
               features: bool) -> ort.InferenceSession:
        """The session ``run_range`` runs: a block's own, unless it needs more."""
        if end - start > 1 or ramp is not None or (features and self._sited(start, end)):
            return self.merged(start, end, ramp, heads, features)
        return self._blocks[start]

    def _sited(self, start: int, end: int) -> list:
        """The ramps (specs) whose sites are in blocks [start, end)."""
        return [r for r in self.ramps if start <= r.after_block < end]

    def _collect(self, out: list, layout: _Layout, into: dict[int, np.ndarray], x,
                 model_inputs: dict[str, np.ndarray] | None) -> None:
        """The features a run of a session with ``layout`` output, into ``into``."""
        if model_inputs is None and isinstance(x, dict):
            model_inputs = x
        for i, r, pool in layout.features:
            got = as_numpy(out[i])
            if pool is not None:  # a raw site activation (see _with_features)
                names = self.manifest.ramp(r).inputs
                mask = model_inputs[names[0]] if names and model_inputs is not None else None
                got = pool_np(got, pool, mask)
            into[r] = np.asarray(got, dtype=np.float32).reshape(len(got), -1)  # N×C×1×1 too

    def _run(self, sess: ort.InferenceSession, what: str, x, model_inputs, keep: bool) -> list:
        """Run ``sess`` on activation ``x`` (or the model inputs, for block 0) and the model
        inputs it reads. ``keep``: the first output feeds another range of this stage, so it
        stays in the runtime's memory (an OrtValue, see ``run_range``); otherwise, on the
        CPU, one plain call returns numpy outputs (an IOBinding costs about 0.1 ms more per
        call on a 2-core machine)."""
        feeds = self._feeds(sess, what, x, model_inputs)
        if keep or self._out_device != "cpu" \
                or any(isinstance(v, ort.OrtValue) for v in feeds.values()):
            return self._run_bound(sess, feeds)
        return sess.run(None, feeds, self._ro())

    def _feeds(self, sess: ort.InferenceSession, what: str, x, model_inputs
               ) -> dict[str, np.ndarray | ort.OrtValue]:
        """Each input of ``sess``: a model input from ``model_inputs`` (``x`` itself when it
        is the inputs dict), else the activation ``x`` (an OrtValue stays one)."""
        if isinstance(x, dict):
            model_inputs = x if model_inputs is None else model_inputs
        feeds: dict[str, np.ndarray | ort.OrtValue] = {}
        for name in self._input_names(sess):
            if name in self._in_dtypes:
                if model_inputs is None or name not in model_inputs:
                    raise ValueError(f"{what} read model input {name!r}")
                feeds[name] = self._model_input(name, model_inputs)
            else:
                act = x["x"] if isinstance(x, dict) else x
                feeds[name] = act if isinstance(act, ort.OrtValue) \
                    else np.ascontiguousarray(act, dtype=np.float32)
        return feeds

    def _input_names(self, sess: ort.InferenceSession) -> list[str]:
        names = self._inputs.get(sess)
        if names is None:
            names = self._inputs[sess] = [i.name for i in sess.get_inputs()]
        return names

    def _run_bound(self, sess: ort.InferenceSession,
                   feeds: dict[str, np.ndarray | ort.OrtValue]) -> list:
        """Run ``sess`` through an IOBinding (an OrtValue input stays in the runtime's
        memory); the first output stays on the device, the others (ramp logits, tap
        outcomes) come to the CPU."""
        io = sess.io_binding()
        for name, value in feeds.items():
            if isinstance(value, ort.OrtValue):
                io.bind_ortvalue_input(name, value)
            else:
                io.bind_cpu_input(name, value)
        outputs = sess.get_outputs()
        io.bind_output(outputs[0].name, self._out_device)
        for o in outputs[1:]:
            io.bind_output(o.name, "cpu")  # ramp logits: small, read right away
        sess.run_with_iobinding(io, self._ro())
        return io.get_outputs()

    def head_file(self, ramp: int, heads: Mapping[int, str] | None = None) -> str:
        """The head file ``ramp`` serves under ``heads`` (ramp -> a file name in the model
        dir, e.g. an online refit's version; a ramp it does not name: the prepared file).
        ValueError when the ramp is not in this stage, or the name is not a plain file name
        of an existing file in the model dir (a bad config must not reach the runtime)."""
        file = heads.get(ramp) if heads else None
        prepared = self._prepared.get(ramp)
        if prepared is None:
            raise ValueError(f"ramp {ramp} is not in this stage ({sorted(self._prepared)})")
        if file is None:
            return prepared
        plain_head_file(file)  # the rule exit configs are checked by
        if file in self._checked:
            return file
        if not (self.model_dir / file).is_file():
            raise ValueError(f"ramp {ramp}'s head {file!r} is not in {self.model_dir}")
        self._checked.add(file)
        return file

    def _head(self, ramp: int, heads: Mapping[int, str] | None) -> ort.InferenceSession:
        """The session of ``ramp``'s head as ``heads`` names it, loaded on first use."""
        key = (ramp, self.head_file(ramp, heads))
        sess = self._heads.get(key)
        if sess is None:
            try:
                sess = self._load(key[1])
            except Exception as exc:  # a corrupt file: a bad config
                raise ValueError(f"ramp {ramp}'s head {key[1]!r} cannot be loaded: {exc}") \
                    from exc
            self._heads[key] = sess
        return sess

    def forget_heads(self, keep: Mapping[int, str]) -> None:
        """Drop every cached session (tapped, merged, head) that uses a head file of a ramp
        other than the one ``keep`` names for it (its prepared file when ``keep`` does not
        name it): a worker calls it once it serves a new config, so memory does not grow
        with head versions. A batch still running on a dropped session finishes on it."""
        want = {r.index: (keep.get(r.index) if keep else None) or r.file for r in self.ramps}
        with self._merge_lock:
            for key in [k for k in self._tapped
                        if any(want.get(r) != f for r, f in zip(k[0], k[1], strict=True))]:
                del self._tapped[key]
            for key in list(self._tap_used):
                if key not in self._tapped:
                    self._tap_used.pop(key, None)
            for key in [k for k in self._merged if k[2] is not None and want.get(k[2]) != k[3]]:
                del self._merged[key]
            for key in [k for k in self._heads if want.get(k[0]) != k[1]]:
                del self._heads[key]

    # ------------------------------------------------------------------ tapped stages

    def tapped(self, ramps: tuple[int, ...], heads: Mapping[int, str] | None = None,
               features: bool = False) -> ort.InferenceSession | None:
        """The whole stage with ``ramps`` (active, in this stage, in site order; their head
        files as ``heads`` names them) fused in and tapped (``services.runtime.taps``): one
        runtime call per batch. ``features``: it also outputs every site's pooled features
        (then it exists without ramps too). None when taps are unavailable here or the
        runtime does not run them in place; the stage then splits at each ramp
        (``run_range``). Built and checked on first use."""
        if not ramps and not features:
            return None
        key = (ramps, tuple(self.head_file(r, heads) for r in ramps), features)
        sess = self._tapped.get(key, _UNBUILT)  # no lock: batches never wait for a build
        if sess is _UNBUILT:
            with self._merge_lock:
                sess = self._tapped.get(key, _UNBUILT)
                if sess is _UNBUILT:
                    sess = self._tapped[key] = self._build_tapped(*key)
                    self._evict_tapped(keep=key)
        self._tap_used[key] = next(self._uses)
        return sess

    def _evict_tapped(self, keep: TapKey) -> None:
        """Drop the least recently used tapped sessions beyond the limit (a batch still
        running on one keeps it alive until it ends)."""
        while len(self._tapped) > TAPPED_SESSIONS_KEPT:
            victim = min((k for k in self._tapped if k != keep),
                         key=lambda k: self._tap_used.get(k, -1))
            del self._tapped[victim]
            self._tap_used.pop(victim, None)

    def preload_taps(self) -> None:
        """Build or load the ramp tap library now (a compile on a machine's first start),
        not when the first config with active ramps arrives."""
        if self.use_taps and self._providers[0] == CPU and tap_library.load() is not None:
            with self._merge_lock:
                self._tap_stage()

    def _build_tapped(self, ramps: tuple[int, ...], files: tuple[str, ...], features: bool
                      ) -> ort.InferenceSession | None:
        if not self.use_taps or self._providers[0] != CPU:
            return None  # a GPU run would copy each ramp's logits out mid-graph: split there
        what = f"ramps {list(ramps)}" + (" with features" if features else "")
        lib = tap_library.load() if ramps else None  # features alone need no taps
        if ramps and lib is None:
            self.tap_notes.append(f"{tap_library.failure()}: ramps split stages")
            return None
        stage = self._tap_stage()
        heads = [(r, self._site(r), self._head_model(r, f))
                 for r, f in zip(ramps, files, strict=True)]
        sites = [(r.index, self._site(r.index), self._head_model(r.index, r.file))
                 for r in self.ramps] if features else []
        try:  # the cached stage's bytes + the heads' and taps' (see taps.tap_extension)
            extension = taps.tap_extension(stage.facts, heads, sites).SerializeToString()
        except Exception as exc:  # noqa: BLE001 - e.g. an opset mismatch in a user's model
            self.tap_notes.append(f"{what} cannot be tapped ({exc}): split")
            return None
        try:
            sess = self._load_tapped(stage, extension, ramps, lib)
        except Exception as exc:  # noqa: BLE001 - e.g. a trial input the graph rejects
            self.tap_notes.append(f"{what} could not be checked ({exc!r}): split")
            return None
        if isinstance(sess, str):
            self.tap_notes.append(f"{what}: {sess}: split")
            return None
        n = len(ramps)  # outputs: the stage's, the taps', then every site's features
        self._layouts[sess] = _Layout(taps=n, features=tuple(
            (1 + n + k, r.index, None) for k, r in enumerate(self.ramps if features else ())))
        return sess

    def _load_tapped(self, stage: _TapStage, extension: bytes, ramps: tuple[int, ...], lib
                     ) -> ort.InferenceSession | str:
        """The session of ``stage`` + ``extension``, its taps' order checked: the session,
        or why the taps do not run in place."""
        later = {}
        for r in ramps:  # nodes only after the site (free nodes repeat in every block)
            cut = self.manifest.ramp(r).after_block + 1 - self.first_block
            later[r] = set().union(*stage.names[cut:]) - set().union(*stage.names[:cut])
        with tempfile.TemporaryDirectory(prefix="offramp-taps-") as tmp:
            # Loaded from a file the two parts are written to: joining them in memory and
            # handing the runtime bytes both hold the GIL (a thread of the worker waited up
            # to 0.25 s per MiniLM build); file writes and a load from a path do not.
            path = Path(tmp) / "tapped.onnx"
            with open(path, "wb") as f:
                f.write(stage.data)
                f.write(extension)
            if not ramps:  # no taps (features alone): a run without ramps, nothing to check
                return ort.InferenceSession(str(path), self._so, providers=self._providers)
            so = session_options(self.threads, False)  # answers mid-run: never spins
            so.register_custom_ops_library(lib.path)
            taps.profile_into(so, tmp)  # the first run only: verify_order ends it
            sess = ort.InferenceSession(str(path), so, providers=self._providers)
            check = taps.verify_order(sess, self.dummy_feeds(sess), ramps, later)
        return sess if check.ok else check.reason

    def _head_model(self, ramp: int, file: str):
        """The ONNX model of ``ramp``'s head in ``file`` (checked by ``head_file``)."""
        import onnx

        try:
            return onnx.load(str(self.model_dir / file))
        except Exception as exc:  # a corrupt file: a bad config
            raise ValueError(f"ramp {ramp}'s head {file!r} cannot be loaded: {exc}") from exc

    def _site(self, ramp: int) -> str:
        """The tensor ramp ``ramp`` reads: the output of the block it follows."""
        return self.manifest.blocks[self.manifest.ramp(ramp).after_block].output_name

    def _tap_stage(self) -> _TapStage:
        """The whole stage, assembled and serialized once (every tapped session of this
        stage starts from these bytes; building them holds the GIL for a while on large
        models, so ``preload_taps`` does it before serving)."""
        if self._tap_base is None:
            import onnx

            blocks = self.manifest.blocks[self.first_block:self.last_block]
            parts = [onnx.load(str(self.model_dir / b.file)) for b in blocks]
            stage = assemble(parts, 0, len(parts))
            self._tap_base = _TapStage(stage.SerializeToString(), taps.StageFacts.of(stage),
                                       [frozenset(_node_names(p)) for p in parts])
        return self._tap_base

    def dummy_feeds(self, sess: ort.InferenceSession) -> dict[str, np.ndarray]:
        """Inputs of the right types and ranks for a trial run (batch 1, other free
        dimensions 8; ones, which are valid token ids and attention masks too)."""
        out = {}
        for i in sess.get_inputs():
            shape = [d if isinstance(d, int) and d > 0 else (1 if k == 0 else 8)
                     for k, d in enumerate(i.shape)]
            out[i.name] = np.ones(shape, dtype=ORT_DTYPES.get(i.type, np.float32))
        return out

    def run_tapped(self, sess: ort.InferenceSession, x, model_inputs, plan, exit_at: np.ndarray,
                   on_exit=None, features: dict[int, np.ndarray] | None = None
                   ) -> tuple[np.ndarray | ort.OrtValue, list[np.ndarray]]:
        """One call of a ``tapped`` session, its taps deciding exits by ``plan`` (a
        ``taps.TapPlan``) on ``exit_at``; ``on_exit`` runs inside the call, on this thread,
        for the rows that exit (``taps.run_with_taps``). Returns the stage's output and, per
        tapped ramp in site order, the (label, score) of every row (float [batch, 2]).
        ``features``: a dict that gets every site's pooled features (a session built with
        them)."""
        layout = self._layouts.get(sess)

        def call() -> list:
            return self._run(sess, "the tapped stage", x, model_inputs, keep=False)

        if layout is not None and layout.taps == 0:
            out = call()  # features alone: no taps to drive
        else:
            out, _ = run_with_taps(call, plan, exit_at, on_exit)
        n = len(out) - 1 if layout is None else layout.taps
        if features is not None and layout is not None:
            self._collect(out, layout, features, x, model_inputs)
        return out[0], [as_numpy(o) for o in out[1:1 + n]]

    def merged(self, start: int, end: int, ramp: int | None = None,
               heads: Mapping[int, str] | None = None, features: bool = False
               ) -> ort.InferenceSession:
        """The session for blocks [start, end) (+ the head of ``ramp`` fused, its file as
        ``heads`` names it; + the pooled features of the sites in the range), assembled from
        the block files on first use (thread-safe: a worker warms a new config's ranges in a
        thread)."""
        file = None if ramp is None else self.head_file(ramp, heads)
        key = (start, end, ramp, file, features and bool(self._sited(start, end)))
        if key not in self._merged:
            with self._merge_lock:
                if key not in self._merged:
                    whole = key[:3] == (self.first_block, self.last_block, None)
                    model, layout = self._assemble(*key)
                    sess = ort.InferenceSession(model.SerializeToString(),
                                                self._so if whole else self._quiet,
                                                providers=self._providers)
                    self._layouts[sess] = layout
                    self._merged[key] = sess
        return self._merged[key]

    def _assemble(self, start: int, end: int, ramp: int | None, file: str | None,
                  features: bool):
        import onnx

        parts = [onnx.load(str(self.model_dir / b.file)) for b in self.manifest.blocks[start:end]]
        model = assemble(parts, 0, len(parts))
        fused: dict[int, str] = {}  # ramp -> its features tensor, when its head is in
        if ramp is not None:
            head = self._head_model(ramp, file)
            act = model.graph.output[0].name
            try:
                model, fused = (with_head(model, head, f"ramp{ramp}/"),
                                {ramp: features_name(head, f"ramp{ramp}/", act)})
            except Exception:  # noqa: BLE001 - e.g. opset mismatch in a user's model: run apart
                fused = {}
        if not features:
            return model, _Layout(logits=bool(fused))
        return self._with_features(model, self._sited(start, end), fused)

    def _with_features(self, model, sited: list, fused: dict[int, str]) -> tuple:
        """``model`` that also outputs the pooled features of the ``sited`` ramps (specs),
        pooled in the graph; where a head's pooling does not fit the graph, the raw site
        activations, pooled in numpy (``_collect``)."""
        import onnx

        base = len(model.graph.output)
        sites = [(r.index, self._site(r.index), self._head_model(r.index, r.file))
                 for r in sited]
        try:
            ext = taps.site_features(taps.StageFacts.of(model), sites, fused)
        except Exception:  # noqa: BLE001 - e.g. a head of another opset
            out = add_outputs(model, [site for _, site, _ in sites])
            names = [o.name for o in out.graph.output]
            return out, _Layout(logits=bool(fused), features=tuple(
                (names.index(site), r.index, pool_of_arch(r.arch))
                for r, (_, site, _) in zip(sited, sites, strict=True)))
        out = onnx.ModelProto()
        out.CopyFrom(model)
        out.MergeFrom(ext)
        return out, _Layout(logits=bool(fused), features=tuple(
            (base + k, r.index, None) for k, r in enumerate(sited)))

    def warm(self, active, heads: Mapping[int, str] | None = None, features: bool = False,
             split: bool = False) -> None:
        """Build the sessions an exit config with ``active`` ramps and ``heads`` needs
        (with every site's features: ``features``) before it is applied: the tapped stage,
        else (or with ``split``: compute mode, where the batch shrinks at each ramp) the
        split ranges (each with its first ramp) and the heads run apart. ValueError when
        ``heads`` names a bad file for a ramp of this stage."""
        for r in self.ramps:
            if heads and r.index in heads:
                self._head(r.index, heads)  # checks (and loads) every head the config names
        here = active_in_order(self.ramps, active)
        if not split and (here or features) and self.tapped(here, heads, features) is not None:
            return
        after = ramps_after_blocks(self.ramps, active)
        for a, b in block_ranges(self.first_block, self.last_block, set(after)):
            at = after.get(b - 1, [])
            self._range(a, b, at[0] if at else None, heads, features)
            for r in at[1:]:
                self._head(r, heads)

    def run_ramp(self, r: int, x: np.ndarray | ort.OrtValue,
                 model_inputs: dict[str, np.ndarray] | None = None,
                 heads: Mapping[int, str] | None = None) -> np.ndarray:
        """Logits of ramp ``r`` (its head file as ``heads`` names it) on the output of its
        block (and the model inputs its head reads, e.g. an attention mask)."""
        feeds = {"x": np.ascontiguousarray(as_numpy(x), dtype=np.float32)}
        for name in self.manifest.ramp(r).inputs:
            if model_inputs is None or name not in model_inputs:
                raise ValueError(f"ramp {r} of {self.manifest.name} reads model input "
                                 f"{name!r}: pass it in model_inputs")
            feeds[name] = self._model_input(name, model_inputs)
        return self._head(r, heads).run(None, feeds, self._ro())[0]

    def run_all(
        self, inputs: dict[str, np.ndarray] | np.ndarray,
        model_inputs: dict[str, np.ndarray] | None = None,
        on_site: Callable[[int, np.ndarray, dict[str, np.ndarray] | None], None] | None = None,
        heads: Mapping[int, str] | None = None,
    ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """Run every block of the stage; return its output and every ramp's logits (heads
        as ``heads`` names them). ``on_site(ramp, activation, model_inputs)`` sees each
        ramp's site activation."""
        by_block: dict[int, list[int]] = {}
        for r in self.ramps:
            by_block.setdefault(r.after_block, []).append(r.index)
        x: dict[str, np.ndarray] | np.ndarray = inputs
        if model_inputs is None and isinstance(inputs, dict):
            model_inputs = inputs
        ramp_logits: dict[int, np.ndarray] = {}
        for i in range(self.first_block, self.last_block):
            x = self.run_block(i, x, model_inputs)
            for r in by_block.get(i, []):
                ramp_logits[r] = self.run_ramp(r, x, model_inputs, heads)
                if on_site is not None:
                    on_site(r, x, model_inputs)
        assert isinstance(x, np.ndarray)
        return x, ramp_logits

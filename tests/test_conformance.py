"""The EP conformance suite (``epctx.testing.conformance``) on every compiling EP found here: the example EP
always, OpenVINO when installed, any other compiling EP registered or found by entry point, and plugin EP
libraries (see ``_plugin_profiles``). One test per (EP, case); each EP runs the suite once per module."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from epctx.testing.conformance import CASES, CaseResult, compiling_providers, format_table, run_conformance


@dataclasses.dataclass(frozen=True)
class Profile:
    """How the suite runs one EP: its options, its tolerance, options for single cases."""

    ep: str
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    atol: float = 1e-4
    rtol: float = 1e-4
    case_options: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    fresh_process_setup: str = ""


_KNOWN = {
    "ExampleExecutionProvider": Profile("ExampleExecutionProvider", atol=1e-5, rtol=1e-5),
    "OpenVINOExecutionProvider": Profile(
        "OpenVINOExecutionProvider",
        case_options={
            # OpenVINO takes LayerNormalization: leave it to the CPU EP so the model has two partitions.
            "partial_model": {"disabled_ops": "LayerNormalization"},
            # Shared weights are stored once only in weightless binaries (blobs otherwise hold the weights).
            "weight_sharing": {"weightless": "1"},
        },
    ),
    "IREEExecutionProvider": Profile(
        "IREEExecutionProvider",
        atol=1e-5,
        rtol=1e-5,
        # IREE compiles LayerNormalization: leave it to the CPU EP so the model has two partitions.
        case_options={"partial_model": {"disabled_ops": "LayerNormalization"}},
    ),
}


PLUGIN_LIBRARY = Path(__file__).resolve().parent / "fixtures" / "plugin_ep" / "plugin_ep.py"
PLUGIN_REGISTRATION = "conformance_contoso"
_REGISTER_PLUGIN = f"import epctx; epctx.register_execution_provider_library({PLUGIN_REGISTRATION!r}, {str(PLUGIN_LIBRARY)!r})"


def _plugin_profiles() -> list[Profile]:
    """Plugin EP libraries: the fixture library (tests/fixtures/plugin_ep/plugin_ep.py, the Contoso EP, which
    imports only epctx.ep) registered by path for this module (``plugin_registered``) and, in the fresh processes
    the round-trip cases start, by ``fresh_process_setup``. Add other plugin libraries here."""
    if not PLUGIN_LIBRARY.is_file():
        return []
    return [Profile("ContosoExecutionProvider", atol=1e-5, rtol=1e-5, fresh_process_setup=_REGISTER_PLUGIN)]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


def _profiles() -> list[Profile]:
    plugins = _plugin_profiles()
    names = [n for n in compiling_providers() if n not in {p.ep for p in plugins}]
    backends = {"OpenVINOExecutionProvider": "openvino", "IREEExecutionProvider": "iree.runtime"}
    for name in ("ExampleExecutionProvider", *backends):  # always when installed, whatever discovery says
        if name not in names and (name not in backends or _installed(backends[name])):
            names.append(name)
    return [_KNOWN.get(name, Profile(name)) for name in names] + plugins


PROFILES = {p.ep: p for p in _profiles()}


@pytest.fixture(scope="module")
def plugin_registered() -> Iterator[None]:
    """The fixture plugin library, registered by path while this module runs."""
    import epctx

    if not PLUGIN_LIBRARY.is_file():
        yield
        return
    epctx.register_execution_provider_library(PLUGIN_REGISTRATION, str(PLUGIN_LIBRARY))
    try:
        yield
    finally:
        import gc

        gc.collect()  # the suite's sessions are gone: the library may be unregistered
        epctx.unregister_execution_provider_library(PLUGIN_REGISTRATION)


@pytest.fixture(scope="module")
def results(plugin_registered: None) -> Iterator[dict[str, list[CaseResult]]]:
    """The suite's results per EP, each EP run once (on first use) for all cases."""
    found: dict[str, list[CaseResult]] = {}
    yield found
    if found:
        print("\n" + format_table(found))


def _results_for(ep: str, results: dict[str, list[CaseResult]], tmp: Path) -> dict[str, CaseResult]:
    if ep not in results:
        p = PROFILES[ep]
        results[ep] = run_conformance(
            ep,
            p.options,
            tmp_dir=tmp,
            atol=p.atol,
            rtol=p.rtol,
            case_options=p.case_options,
            fresh_process_setup=p.fresh_process_setup,
        )
    return {r.case: r for r in results[ep]}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("ep", sorted(PROFILES))
def test_conformance(
    ep: str, case: str, results: dict[str, list[CaseResult]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp(f"conformance_{ep}") if ep not in results else Path()
    result = _results_for(ep, results, tmp)[case]
    assert result.passed, f"{ep} {case}: {result.detail}"
    assert result.delegated_nodes, f"{ep} {case}: no node was delegated"
    if result.max_error is not None:
        assert result.max_error <= PROFILES[ep].atol * 10  # atol + rtol * |y| with |y| <= 9 here


def test_example_ep_takes_every_node_of_the_chain(
    results: dict[str, list[CaseResult]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The table reports per case which nodes went to the EP: the example EP takes every node but
    LayerNormalization."""
    ep = "ExampleExecutionProvider"
    tmp = tmp_path_factory.mktemp("conformance_example") if ep not in results else Path()
    found = _results_for(ep, results, tmp)
    assert found["round_trip_embed0"].delegated_nodes == ("mm1", "add1", "relu", "mm2", "sig")
    partial = found["partial_model"]
    assert (len(partial.delegated_nodes), partial.total_nodes) == (
        5,
        6,
    ) and "ln" not in partial.delegated_nodes


def test_a_failing_ep_is_reported_not_raised(tmp_path: Path) -> None:
    """A case that fails is a result with the reason, and the other cases still run."""
    (result,) = run_conformance("NoSuchExecutionProvider", tmp_dir=tmp_path, cases=["round_trip_embed0"])
    assert not result.passed and "NoSuchExecutionProvider" in result.detail
    with pytest.raises(ValueError, match="unknown conformance case"):
        run_conformance("ExampleExecutionProvider", tmp_dir=tmp_path, cases=["no_such_case"])


@pytest.mark.slow
def test_command_prints_the_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import subprocess
    import sys

    from epctx.cli import main

    args = [
        "conformance",
        "-p",
        "ExampleExecutionProvider",
        "--case",
        "partial_model",
        "--keep",
        str(tmp_path),
    ]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "partial_model" in table and "5/6" in table and "yes" in table
    assert main([*args[:5], "--keep", str(tmp_path / "again"), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["ExampleExecutionProvider"]
    assert row["passed"] and row["total_nodes"] == 6 and row["max_error"] < 1e-4
    # python -m epctx.cli conformance is the same command (epctx.testing does not import the command line)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "epctx.cli",
            "conformance",
            *args[1:5],
            "--keep",
            str(tmp_path / "m"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ExampleExecutionProvider"][0]["passed"]
    assert main(["conformance", "-p", "ExampleExecutionProvider", "--case-option", "nope:k=v"]) == 1
    assert "unknown case 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_no_compile_guard_by_context_and_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import epctx
    import epctx.session.builder
    from epctx.testing import NO_COMPILE_ENV, no_compile
    from epctx.testing.conformance import models

    assert no_compile is epctx.session.builder.no_compile  # the old import path keeps working
    data = models.chain().SerializeToString()
    with no_compile(), pytest.raises(epctx.ModelRequiresCompilation, match="ExampleExecutionProvider"):
        epctx.InferenceSession(data, providers=["ExampleExecutionProvider"])
    monkeypatch.setenv(NO_COMPILE_ENV, "1")
    with pytest.raises(epctx.ModelRequiresCompilation, match=f"ExampleExecutionProvider.*{NO_COMPILE_ENV}=1"):
        epctx.InferenceSession(data, providers=["ExampleExecutionProvider"])
    epctx.InferenceSession(data)  # nothing to compile on the CPU EP: the guard stays silent
    monkeypatch.setenv(NO_COMPILE_ENV, "0")
    epctx.InferenceSession(data, providers=["ExampleExecutionProvider"])

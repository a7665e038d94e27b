"""The EP conformance suite (``epctx.testing.conformance``) on every compiling EP found here: each EP folder
that declares a profile (``EP_CONFORMANCE``: the example EP always, OpenVINO and IREE when installed), any
other compiling EP registered or found by entry point, and plugin EP libraries (see ``_plugin_profiles``). One
test per (EP, case); each EP runs the suite once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from epctx.testing.conformance import (
    CASES,
    CaseResult,
    Profile,
    conformance_profiles,
    declared_profiles,
    format_table,
    run_conformance,
    run_profile,
)

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


def _profiles() -> list[Profile]:
    """The profile each EP folder declares (``EP_CONFORMANCE``; installed ones), any other compiling EP found
    here with the default profile, and the plugin libraries'. Nothing here names an EP folder."""
    plugins = _plugin_profiles()
    return [p for p in conformance_profiles() if p.ep not in {q.ep for q in plugins}] + plugins


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
        results[ep] = run_profile(PROFILES[ep], tmp_dir=tmp)
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


def test_each_ep_folder_declares_its_profile() -> None:
    """The profiles come from the folders (EP_CONFORMANCE): the example EP's tolerance is its own, OpenVINO's
    and IREE's case options theirs, when installed."""
    import importlib.util

    declared = {p.ep: p for p in declared_profiles()}
    example = declared["ExampleExecutionProvider"]
    assert (example.atol, example.rtol, dict(example.case_options)) == (1e-5, 1e-5, {})
    for name, module in (
        ("OpenVINOExecutionProvider", "openvino"),
        ("IREEExecutionProvider", "iree.runtime"),
    ):
        installed = importlib.util.find_spec(module.split(".")[0]) is not None
        assert (name in declared) == (installed and importlib.util.find_spec(module) is not None)
        if name in declared:
            assert declared[name].case_options["partial_model"] == {"disabled_ops": "LayerNormalization"}
    assert [p.ep for p in conformance_profiles()][: len(declared)] == list(declared)


_NEW_EP_INIT = """
EP_NAME = "ZetaExecutionProvider"
EP_CLASS = "epctx.providers.zeta.provider:ZetaExecutionProvider"
EP_CONFORMANCE = {"atol": 1e-3, "options": {"level": 2}, "case_options": {"partial_model": {"ops": "MatMul"}}}
"""
_NEW_EP_PROVIDER = """
from epctx.ep import Capability, ExecutionProvider


class ZetaExecutionProvider(ExecutionProvider):
    name = "ZetaExecutionProvider"
    compiles = True

    def get_capability(self, graph, opset_imports, ctx):
        return Capability(())
"""


@pytest.fixture
def new_ep_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A new EP folder, epctx/providers/zeta/, and nothing else edited."""
    import sys

    import epctx.providers
    from epctx.providers import registry

    folder = tmp_path / "folders" / "zeta"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(_NEW_EP_INIT)
    (folder / "provider.py").write_text(_NEW_EP_PROVIDER)
    monkeypatch.setattr(epctx.providers, "__path__", [*epctx.providers.__path__, str(folder.parent)])
    registry.builtin_declarations.cache_clear()
    yield folder
    monkeypatch.undo()
    registry.builtin_declarations.cache_clear()
    for name in ("epctx.providers.zeta.provider", "epctx.providers.zeta"):
        sys.modules.pop(name, None)


def test_a_new_ep_folder_brings_its_profile(new_ep_folder: Path) -> None:
    (zeta,) = [p for p in declared_profiles() if p.ep == "ZetaExecutionProvider"]
    assert (zeta.atol, zeta.rtol, dict(zeta.options)) == (1e-3, 1e-4, {"level": "2"})
    assert dict(zeta.case_options) == {"partial_model": {"ops": "MatMul"}}
    assert "ZetaExecutionProvider" in [p.ep for p in conformance_profiles()]


def test_a_bad_declared_profile_names_its_folder(new_ep_folder: Path) -> None:
    from epctx.errors import InvalidArgument
    from epctx.providers import registry

    (new_ep_folder / "__init__.py").write_text(_NEW_EP_INIT.replace('"atol"', '"atoll"'))
    registry.builtin_declarations.cache_clear()
    import sys

    sys.modules.pop("epctx.providers.zeta", None)
    with pytest.raises(
        InvalidArgument, match=r"epctx\.providers\.zeta: EP_CONFORMANCE has unknown key\(s\) \['atoll'\]"
    ):
        declared_profiles()


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


@pytest.mark.slow
def test_command_runs_an_ep_with_its_folders_profile(capsys: pytest.CaptureFixture[str]) -> None:
    """``epctx conformance -p OpenVINOExecutionProvider`` takes the case options OpenVINO's folder declares
    (LayerNormalization left to the CPU EP in partial_model); the command line's own come on top."""
    import importlib.util
    import json

    from epctx.cli import main

    if importlib.util.find_spec("openvino") is None:
        pytest.skip("OpenVINO is not installed")
    args = ["conformance", "-p", "OpenVINOExecutionProvider", "--case", "partial_model", "--json"]
    assert main(args) == 0
    (row,) = json.loads(capsys.readouterr().out)["OpenVINOExecutionProvider"]
    assert row["passed"] and "ln" not in row["delegated_nodes"] and row["total_nodes"] == 6
    # the command line's case option replaces the profile's: OpenVINO takes LayerNormalization, the case fails
    assert main([*args, "--case-option", "partial_model:disabled_ops=Sigmoid"]) == 1
    (row,) = json.loads(capsys.readouterr().out)["OpenVINOExecutionProvider"]
    assert not row["passed"] and "ln" in row["delegated_nodes"]

"""The package's surface: the type stubs name exactly what the compiled module has, and
the documented layout (py.typed, the stubs) is installed."""

from __future__ import annotations

import ast
import importlib.resources
from pathlib import Path

import toolledger
from toolledger import _toolledger


def stubs() -> dict[str, set[str]]:
    text = importlib.resources.files("toolledger").joinpath("_toolledger.pyi").read_text()
    classes: dict[str, set[str]] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef):
            members = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in classes:
                    members |= classes[base.id]
            classes[node.name] = members
    return classes


def test_the_stubs_name_every_class_and_member_of_the_compiled_module():
    declared = stubs()
    runtime = {name for name in dir(_toolledger) if isinstance(getattr(_toolledger, name), type)}
    # Helper bases of the stubs only (`_Done`) are not runtime classes.
    assert {name for name in declared if name != "_Done"} == runtime
    for name in runtime:
        cls = getattr(_toolledger, name)
        if issubclass(cls, Exception):
            continue
        public = {member for member in vars(cls) if not member.startswith("__")}
        assert public == declared[name] - {"__init__", "__enter__", "__exit__", "__bool__"}, name


def test_py_typed_and_the_stubs_are_installed():
    files = importlib.resources.files("toolledger")
    assert files.joinpath("py.typed").is_file()
    assert files.joinpath("_toolledger.pyi").is_file()


def test_every_exported_name_exists():
    for name in toolledger.__all__:
        assert hasattr(toolledger, name), name
    assert issubclass(toolledger.InvalidError, toolledger.Error)
    assert issubclass(toolledger.StoreError, toolledger.Error)
    assert issubclass(toolledger.RolesError, toolledger.Error)


def test_the_readmes_example_runs_as_written(tmp_path, monkeypatch, capsys):
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    example = section.split("```python\n", 1)[1].split("```\n", 1)[0]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    scope["ledger"].close()
    assert capsys.readouterr().out.splitlines() == [
        "Fresh {'message_id': 'm-1'}",
        "Replayed {'message_id': 'm-1'}",
    ]
    assert scope["sent"] == ["ana@example.com"]


def test_the_readmes_asyncio_example_runs_as_written(tmp_path, monkeypatch, capsys):
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    example = section.split("```python\n")[2].split("```\n", 1)[0]
    assert "asyncio.gather" in example
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    scope["ledger"].close()
    assert capsys.readouterr().out.splitlines() == ["['Fresh', 'Fresh', 'Fresh', 'Fresh']"]

"""The package's layers (README, Architecture): a module imports only modules listed before it."""

import ast
from pathlib import Path

import translate

ORDER = [
    # foundations
    "errors", "options", "textio", "hardware", "tokenizer", "batching", "loss", "protect", "distributed", "syncs",
    # config and data
    "config", "sources", "data", "evaluate",
    # paragraphs, glossaries, documents
    "glossary", "segment", "markup", "html_document", "markdown_document", "documents",
    # model
    "model", "search", "checkpoint", "adapt",
    # using a model
    "prepare", "inference", "decoding", "batcher", "engine", "pool", "plot", "report", "export", "translator", "tune",
    # training
    "rundir", "optim", "trainstate", "trainlog", "validation", "train",
    # front ends
    "page", "serve", "cli", "__main__",
]  # fmt: skip


def imports(path: Path) -> set[str]:
    """The package's modules that `path` imports, except under `if TYPE_CHECKING:` (annotations only)."""
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("translate."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "translate":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("translate."))
    return found - {path.stem}


def test_every_module_has_a_place_and_imports_only_earlier_ones():
    package = Path(translate.__file__).parent
    modules = {p.stem: p for p in package.glob("*.py") if p.stem != "__init__"}
    assert set(modules) == set(ORDER), "a module is missing from the layers (README, Architecture)"
    upward = [
        f"{name} imports {dep}"
        for name, path in modules.items()
        for dep in imports(path)
        if ORDER.index(dep) > ORDER.index(name)
    ]
    assert not upward, upward


def test_training_does_not_import_the_decoding_front_end_or_the_report():
    train = imports(Path(translate.__file__).parent / "train.py")
    assert not train & {"translator", "report", "cli", "serve"}

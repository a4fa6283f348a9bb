"""Every code block of every guide runs: the docs' guides (``docs/*.rst``) and the README.

A guide's blocks run in order in one namespace, as a reader would type them:

- a block with ``>>>`` prompts (an rst ``::`` block, ``.. code-block:: pycon``) runs as a
  doctest: its printed output must match;
- ``.. code-block:: python`` (a README ```` ```python ```` fence) runs as a script;
- ``.. code-block:: console`` (an indented README command) is a shell command: it must be one
  of the commands CI runs or a documented entry point (``pip``, ``python``, ``torchrun``,
  ``meshplan``);
- any other block (``text``, a bare ``::`` block without prompts) fails the test: say what it is.

Guides written for a world of processes (:data:`WORLDS`) run on every rank of a gloo pool.
"""

from __future__ import annotations

import doctest
import pathlib
import re

import attrs
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDES = (
    "index.rst",
    "concepts.rst",
    "from_dtensor.rst",
    "from_jax.rst",
    "train.rst",
    "real_sizes.rst",
)
COMMANDS = ("pip ", "python ", "torchrun ", "meshplan ")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
#: guides (or README sections) whose code runs on every rank of a gloo world of this size
WORLDS = {
    "from_dtensor.rst": 4,
    "train.rst": 4,
    "README.md#Train a model": 4,
    "README.md#From a torch model": 4,
}


@attrs.frozen
class Block:
    """One code block of a guide: where it starts, its kind and its text."""

    where: str  # "file:line"
    kind: str  # "doctest" | "python" | "console" | anything else (refused)
    text: str


# -- reading guides -------------------------------------------------------------------------

_DIRECTIVE = re.compile(r"^\.\. (?:code-block|code|sourcecode)::\s*(\S*)\s*$")
_LANGS = {"pycon": "doctest", "python": "python", "py": "python", "console": "console"}


def _indented(lines: list[str], start: int) -> tuple[int, list[str]]:
    """The indented block after ``lines[start]`` (options and blank lines skipped)."""
    i = start + 1
    while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith(":")):
        i += 1
    body: list[str] = []
    while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
        body.append(lines[i])
        i += 1
    while body and not body[-1].strip():
        body.pop()
    indent = min((len(s) - len(s.lstrip()) for s in body if s.strip()), default=0)
    return i, [s[indent:] for s in body]


def rst_blocks(text: str, name: str) -> list[Block]:
    """The literal blocks of an rst text: ``.. code-block:: X`` and paragraphs ending ``::``."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _DIRECTIVE.match(line)
        literal = line.rstrip().endswith("::") and not line.lstrip().startswith("..")
        if directive or literal:
            end, body = _indented(lines, i)
            if body:
                code = "\n".join(body) + "\n"
                if directive:
                    kind = _LANGS.get(directive.group(1), directive.group(1) or "unnamed")
                else:
                    kind = "doctest" if code.lstrip().startswith(">>>") else "literal"
                out.append(Block(f"{name}:{i + 2}", kind, code))
            i = max(end, i + 1)
        else:
            i += 1
    return out


def readme_blocks(text: str, name: str = "README.md") -> dict[str, list[Block]]:
    """The README's code blocks by section: ```` ```lang ```` fences and indented commands."""
    lines = text.splitlines()
    sections: dict[str, list[Block]] = {}
    section, i = "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        if line.startswith("```"):
            lang = line[3:].strip()
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            code = "\n".join(lines[i + 1 : j]) + "\n"
            kind = _LANGS.get(lang, lang or "unnamed")
            sections.setdefault(section, []).append(Block(f"{name}:{i + 2}", kind, code))
            i = j + 1
            continue
        if line.startswith("    ") and line.strip() and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and lines[j].startswith("    "):
                j += 1
            code = "\n".join(s[4:] for s in lines[i:j]) + "\n"
            sections.setdefault(section, []).append(Block(f"{name}:{i + 1}", "console", code))
            i = j
            continue
        i += 1
    return sections


def guides() -> dict[str, list[Block]]:
    """Every guide's blocks, by guide (README sections as ``README.md#section``)."""
    out = {name: rst_blocks((DOCS / name).read_text(), name) for name in GUIDES}
    for section, blocks in readme_blocks((ROOT / "README.md").read_text()).items():
        out[f"README.md#{section}"] = blocks
    return out


# -- running them ---------------------------------------------------------------------------


def run_blocks(blocks: list[Block]) -> list[str]:
    """Run the python and doctest blocks in order in one namespace; the failures, as text."""
    namespace: dict = {"__name__": "__guide__"}
    parser = doctest.DocTestParser()
    failures: list[str] = []
    for block in blocks:
        if block.kind == "python":
            try:
                exec(compile(block.text, block.where, "exec"), namespace)
            except Exception as exc:  # reported with the block's place
                failures.append(f"{block.where}: {type(exc).__name__}: {exc}")
        elif block.kind == "doctest":
            test = parser.get_doctest(block.text, namespace, block.where, block.where, 0)
            report: list[str] = []
            runner = doctest.DocTestRunner(optionflags=FLAGS)
            runner.run(test, out=report.append, clear_globs=False)
            namespace.update(test.globs)
            failures.extend(report)
    return failures


def bad_kinds(blocks: list[Block]) -> list[str]:
    """Blocks that are neither code that runs nor a known command."""
    bad = []
    for block in blocks:
        if block.kind == "console":
            for command in block.text.splitlines():
                if command.strip() and not command.startswith(COMMANDS):
                    bad.append(f"{block.where}: command {command!r}")
        elif block.kind not in ("python", "doctest"):
            bad.append(f"{block.where}: a {block.kind!r} block {block.text[:60]!r}")
    return bad


def _run_on_rank(blocks: list[Block]) -> list[str]:
    return run_blocks(blocks)


# -- tests ----------------------------------------------------------------------------------

_ALL = guides()
_PURE = sorted(g for g in _ALL if g not in WORLDS and any(b.kind != "console" for b in _ALL[g]))


def test_every_guide_has_code_and_every_block_says_what_it_is():
    for name in GUIDES[1:]:  # (index.rst: how to build the pages)
        assert any(b.kind in ("python", "doctest") for b in _ALL[name]), name
    assert [bad for blocks in _ALL.values() for bad in bad_kinds(blocks)] == []


@pytest.mark.parametrize("guide", _PURE)
def test_guide_code_runs_as_written(guide):
    failures = run_blocks(_ALL[guide])
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("guide", sorted(WORLDS))
def test_guide_code_runs_on_every_rank(guide, request):
    pool = request.getfixturevalue(f"pool{WORLDS[guide]}")
    blocks = _ALL[guide]
    assert any(b.kind in ("python", "doctest") for b in blocks), guide
    # a guide that plans a model takes tens of seconds on a loaded machine
    for rank, failures in enumerate(pool.run(_run_on_rank, blocks, timeout=600)):
        assert not failures, f"rank {rank}:\n" + "\n".join(failures)


def test_the_runner_reports_a_wrong_output_an_error_and_an_unnamed_block():
    text = """
Title
=====

A doctest::

    >>> 1 + 1
    3

.. code-block:: python

    undefined_name

.. code-block:: text

    something
"""
    blocks = rst_blocks(text, "t.rst")
    assert [b.kind for b in blocks] == ["doctest", "python", "text"]
    failures = run_blocks(blocks)
    assert any("Expected:" in f for f in failures)
    assert any("NameError" in f for f in failures)
    assert bad_kinds(blocks) == [
        f"t.rst:{blocks[2].where.split(':')[1]}: a 'text' block {blocks[2].text[:60]!r}"
    ]
    sections = readme_blocks("# A\n\n```python\nx = 1\n```\n\n    rm -rf x\n")
    assert [b.kind for b in sections["A"]] == ["python", "console"]
    assert bad_kinds(sections["A"]) == ["README.md:7: command 'rm -rf x'"]

"""The code's shape against the bars in CONTRIBUTING.md: lines, largest modules, the package root, the
facade, live patch ids and the docs' page sizes. ``python -m bench.shape``"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentlease"


def module_lines() -> dict[str, int]:
    """Lines per module of the package, by path relative to the repository."""
    return {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in sorted(PACKAGE.rglob("*.py"))}


def page_words() -> dict[str, int]:
    """Words per page of ``docs/`` (as ``wc -w`` counts them)."""
    return {p.name: len(p.read_text().split()) for p in sorted((ROOT / "docs").glob("*.md"))}


def main() -> None:
    import agentlease
    from agentlease.workflow._versions import PATCHES

    lines = module_lines()
    words = page_words()
    largest = sorted(lines.items(), key=lambda item: -item[1])[:3]
    print(f"agentlease/: {sum(lines.values()):,} lines in {len(lines)} modules")
    print("largest modules: " + ", ".join(f"{path} {n}" for path, n in largest))
    print(f"package root: {len(list(PACKAGE.glob('*.py')))} modules")
    print(f"root facade: {len([n for n in agentlease.__all__ if n != '__version__'])} names")
    print(f"live patch ids: {len(PATCHES)}")
    page, most = max(words.items(), key=lambda item: item[1])
    print(f"docs/: {sum(words.values()):,} words in {len(words)} pages; largest {page} {most:,}")


if __name__ == "__main__":
    main()

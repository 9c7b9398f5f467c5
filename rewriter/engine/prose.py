"""A patch's prose, written once: in its module docstring.

A patch module's docstring tells the whole story; two of its paragraphs are
what `deepstack-patch list`, `export` and commit messages print::

    Symptom: a ~205 ms stall when ...

    Fix safety: torch.compile loses dynamic=True ...

:func:`section` returns such a paragraph as one line, so a patch declares
``symptom = section(__doc__, "Symptom")`` instead of writing it twice.
"""

from __future__ import annotations


def section(docstring: str | None, heading: str) -> str:
    """The paragraph of ``docstring`` that starts with ``<heading>:``, as one line.

    Lines are joined with single spaces and reST literals (````x````) become
    ```x```, as the plain-text outputs show them. Raises ``LookupError`` when
    there is no such paragraph, so a patch without its prose fails on import.
    """
    for paragraph in (docstring or "").split("\n\n"):
        text = " ".join(line.strip() for line in paragraph.strip().splitlines())
        if text.startswith(f"{heading}:"):
            return text.removeprefix(f"{heading}:").strip().replace("``", "`")
    raise LookupError(f"no {heading!r} paragraph in the docstring")

"""Sphinx extension: the API reference, generated from the docstrings of every name a module exports.

``.. api-reference:: volcano_locks`` (in a reStructuredText page) expands to one autodoc entry per name in
that module's ``__all__``, in its order: classes with their public members (exceptions with their bases,
so the error tree reads from the page), functions, and constants with their values. The list is read
from the code at build time, so a name added to ``__all__`` is on the page without anyone editing it.

Checks, each a warning that ``make docs`` turns into an error:

* a name in ``__all__`` without a docstring (for a constant: the string literal after its assignment in
  the module that defines it, which is where Sphinx reads attribute docs);
* a public method or property defined by a listed class without a docstring of its own;
* a reference to one of our objects that resolves nowhere. Our modules annotate with the defining path
  (``volcano_locks.models.LockLease``) where the page documents the public one (``volcano_locks.LockLease``):
  such a reference is resolved to the public entry. References to other libraries' objects (the standard
  library, httpx, Airflow, Prefect) cannot resolve without their inventories, which this machine cannot
  download: ``conf.py`` lets those through (``nitpick_ignore_regex``), never ours.

The Airflow provider is documented from the Prefect environment, where Airflow is not installed:
``conf.py`` mocks ``airflow`` for autodoc (``autodoc_mock_imports``), as provider docs commonly do, and
keeps each default's source text (``autodoc_preserve_defaults``) so no mock shows in a signature.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.ext.autodoc.mock import mock
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

logger = logging.getLogger(__name__)

OURS = ("volcano_locks", "airflow_provider_volcano", "prefect_volcano")
"""The packages whose objects the reference documents: a reference into them must resolve."""


def _import(app: Sphinx, name: str) -> Any:
    with mock(app.config.autodoc_mock_imports):
        return importlib.import_module(name)


def _own_doc(obj: Any) -> str:
    """The object's own docstring (never one inherited from a base class)."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return (doc or "").strip()


def _undocumented_members(cls: type) -> list[str]:
    """Public methods and properties ``cls`` defines itself that have no docstring."""
    missing = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        func = value.__func__ if isinstance(value, classmethod | staticmethod) else value
        if isinstance(func, property):
            func = func.fget
        if inspect.isfunction(func) and not _own_doc(func):
            missing.append(name)
    return missing


def _constant_doc(app: Sphinx, package: str, name: str, value: Any) -> str | None:
    """The attribute docstring of a constant, from the module of ``package`` that assigns it."""
    module = _import(app, package)
    top = package.split(".")[0]
    candidates = [package, *sorted(mod for mod in list(sys.modules) if mod.startswith(top + "."))]
    for modname in candidates:
        mod = sys.modules.get(modname) if modname != package else module
        if mod is None or getattr(mod, name, _MISSING) is not value:
            continue
        try:
            docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
        except Exception:  # a module without source (built in, mocked): nothing to read
            continue
        doc = docs.get(("", name))
        if doc:
            return "\n".join(doc).strip()
    return None


_MISSING = object()


def _names(argument: str | None) -> list[str]:
    return (argument or "").replace(",", " ").split()


class ApiReference(SphinxDirective):
    """``.. api-reference:: module``: every name of the module's ``__all__``, documented from its docstring.

    Options, for a module below a package whose page already documents some of its names: ``:exclude:``
    leaves names out, ``:only:`` keeps just the names given (each must be in ``__all__``).
    """

    required_arguments = 1
    option_spec: ClassVar[dict[str, Callable[[str], Any]]] = {
        "exclude": directives.unchanged,
        "only": directives.unchanged,
    }

    def run(self) -> list[nodes.Node]:
        package = self.arguments[0]
        module = _import(self.env.app, package)
        exported = list(getattr(module, "__all__", ()))
        if not exported:
            logger.warning("api-reference: %s has no __all__", package, location=self.get_location())
            return []
        excluded, only = _names(self.options.get("exclude")), _names(self.options.get("only"))
        for name in [*excluded, *only]:
            if name not in exported:
                logger.warning(
                    "api-reference: %s is not in %s.__all__", name, package, location=self.get_location()
                )
        exported = [n for n in exported if n not in excluded and (not only or n in only)]
        lines: list[str] = []
        with mock(self.config.autodoc_mock_imports):  # a lazy export imports its module on first access
            for name in exported:
                lines += self._entry(package, name, getattr(module, name))
        content = StringList(lines, source=f"<api-reference {package}>")
        node = nodes.container(classes=["api-reference"])
        nested_parse_with_titles(self.state, content, node)
        return node.children

    def _entry(self, package: str, name: str, value: Any) -> list[str]:
        where = f"{package}.{name}"
        if isinstance(value, type) or inspect.isfunction(value) or callable(value):
            if not _own_doc(value):
                logger.warning("api-reference: %s has no docstring", where, location=self.get_location())
            if isinstance(value, type):
                for member in _undocumented_members(value):
                    logger.warning(
                        "api-reference: %s.%s has no docstring", where, member, location=self.get_location()
                    )
                kind = "autoexception" if issubclass(value, BaseException) else "autoclass"
                return [f".. {kind}:: {where}", "   :members:", "   :show-inheritance:", ""]
            return [f".. autofunction:: {where}", ""]
        doc = _constant_doc(self.env.app, package, name, value)
        if not doc:
            logger.warning(
                "api-reference: %s has no docstring (a string literal after its assignment)",
                where,
                location=self.get_location(),
            )
        body = [f"   {line}" if line else "" for line in (doc or "").splitlines()]
        return [f".. py:data:: {name}", f"   :module: {package}", f"   :value: {value!r}", "", *body, ""]


def _public_twin(app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.Element) -> Any:
    """Resolve ``volcano_locks.models.LockLease`` to the documented ``volcano_locks.LockLease``."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith(OURS):
        return None
    short = target.rsplit(".", 1)[-1]
    top = target.split(".", 1)[0]
    domain = env.get_domain("py")
    twins = [
        full
        for full in domain.objects  # type: ignore[attr-defined]
        if full.rsplit(".", 1)[-1] == short and full.split(".", 1)[0] == top
    ]
    if len(twins) != 1:
        return None
    return domain.resolve_xref(env, node["refdoc"], app.builder, "obj", twins[0], node, contnode)


def _internal(target: str) -> bool:
    """Whether ``target`` (one of ours) is no part of the public surface, so the reference does not list it.

    A private name or module, a module (the guides describe modules), a type variable, or a name its
    module does not export. Such a reference shows as text without a link. A name its module exports
    must be on a reference page.
    """
    if any(part.startswith("_") for part in target.split(".")):
        return True
    if target in sys.modules:
        return True
    modname, _, name = target.rpartition(".")
    module = sys.modules.get(modname)
    if module is None:
        return False
    return isinstance(getattr(module, name, None), TypeVar) or name not in getattr(module, "__all__", ())


def _quiet_internal(app: Sphinx, domain: Any, node: pending_xref) -> bool | None:
    """``warn-missing-reference``: say nothing for a reference to an internal object of ours."""
    target = node.get("reftarget", "")
    if node.get("refdomain") == "py" and target.startswith(OURS) and _internal(target):
        return True
    return None


_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def _fences_to_code_blocks(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Markdown code fences in a docstring (Prefect's convention) become ``code-block`` directives."""
    out: list[str] = []
    indent: str | None = None
    for line in lines:
        fence = _FENCE.match(line)
        if fence and indent is None:
            indent = fence.group(1)
            out += ["", f"{indent}.. code-block:: {fence.group(2) or 'text'}", ""]
        elif fence and fence.group(1) == indent:
            indent = None
            out.append("")
        elif indent is not None:
            out.append(f"{indent}   {line[len(indent) :]}" if line.strip() else "")
        else:
            out.append(line)
    lines[:] = out


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("api-reference", ApiReference)
    app.connect("missing-reference", _public_twin)
    app.connect("warn-missing-reference", _quiet_internal)
    app.connect("autodoc-process-docstring", _fences_to_code_blocks, priority=400)  # before napoleon
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}

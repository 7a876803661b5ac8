"""A Sphinx directive that runs Python code when the documentation is built and shows its output.

Usage in a page::

    .. exec-code::

        import torch
        print(torch.ones(2))

The block is executed when Sphinx *reads* the page (whatever the builder), in a namespace shared
by all the ``exec-code`` blocks of that page, top to bottom, so later blocks see the names of
earlier ones. The page shows the code and, below it, what the code printed (nothing if it printed
nothing). An exception is reported as a Sphinx warning naming the page and the line of the block,
so ``sphinx -W`` fails on a broken example; the traceback is shown in the page in place of the
output. ``exec_code_setup`` (a string in ``conf.py``) runs once per page, hidden, before the first
block.

Options: ``:hide-code:`` shows only the output; ``:hide-output:`` shows only the code.

``exec_code_run = False`` (e.g. ``sphinx -D exec_code_run=0``) shows the code without running it,
for builds that do not need the output (the test suite's doctest build, which runs the doctest
blocks, not these).

The output shown is the output of this build: numbers in the page are the numbers the code
produced, not numbers typed by hand. Keep such pages to seconds of work.
"""

from __future__ import annotations

import contextlib
import io
import textwrap
import time
import traceback

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

_NAMESPACE_KEY = "exec_code_namespace"


class ExecCode(SphinxDirective):
    has_content = True
    option_spec = {"hide-code": directives.flag, "hide-output": directives.flag}

    def _namespace(self) -> dict:
        # env.temp_data is cleared after each page is read: one namespace per page and build.
        namespace = self.env.temp_data.get(_NAMESPACE_KEY)
        if namespace is None:
            namespace = {"__name__": f"exec_code_{self.env.docname.replace('/', '_')}"}
            setup = self.config.exec_code_setup
            if setup:
                exec(compile(setup, "<exec_code_setup>", "exec"), namespace)
            self.env.temp_data[_NAMESPACE_KEY] = namespace
        return namespace

    def run(self) -> list[nodes.Node]:
        # dedent: with options, docutils measures the indentation from the option lines
        code = textwrap.dedent("\n".join(self.content)).strip("\n")
        _, line = self.get_source_info()
        if not self.config.exec_code_run:
            output = ""
        else:
            output = self._execute(code, line)
        result: list[nodes.Node] = []
        if "hide-code" not in self.options:
            block = nodes.literal_block(code, code, language="python")
            self.set_source_info(block)
            result.append(block)
        if output and "hide-output" not in self.options:
            shown = output.rstrip("\n")
            block = nodes.literal_block(shown, shown, language="none", classes=["exec-code-output"])
            self.set_source_info(block)
            result.append(block)
        return result

    def _execute(self, code: str, line: int) -> str:
        buffer = io.StringIO()
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(buffer):
                exec(
                    compile(code, f"<{self.env.docname}.rst, exec-code block at line {line}>", "exec"),
                    self._namespace(),
                )
            output = buffer.getvalue()
        except Exception:  # noqa: BLE001 - any failure of the example is reported as a build warning
            output = buffer.getvalue() + traceback.format_exc()
            logger.warning("exec-code block failed:\n%s", traceback.format_exc(), location=(self.env.docname, line))
        logger.verbose("exec-code block at %s:%s ran in %.2f s", self.env.docname, line, time.perf_counter() - start)
        return output


def setup(app) -> dict:
    app.add_config_value("exec_code_setup", "", "env")
    app.add_config_value("exec_code_run", True, "env", types=(bool, int))
    app.add_directive("exec-code", ExecCode)
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}

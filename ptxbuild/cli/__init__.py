"""The ptxbuild command line: parse arguments, call the library once, print. Nothing else lives here.

shell.py holds the click group and the one place errors become exit codes; build_cmds.py and
store_cmds.py the commands (authoring.py: new, check --deep); progress.py the build's progress lines.
"""

from __future__ import annotations

import click  # noqa: F401  (tests patch click.echo through here)

from ..errors import EXIT_BUILD_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_TOOL
from . import build_cmds, shell, store_cmds  # noqa: F401  (their commands join the group)
from .authoring import new as _new
from .authoring import try_ as _try
from .progress import Progress
from .shell import main

__all__ = [
    "EXIT_BUILD_FAILED",
    "EXIT_CONFIG",
    "EXIT_INTERRUPTED",
    "EXIT_TOOL",
    "Progress",
    "main",
]

main.add_command(_new)
main.add_command(_try)

if __name__ == "__main__":
    main()

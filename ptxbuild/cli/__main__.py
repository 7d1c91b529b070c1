"""Run ptxbuild's CLI as `python -m ptxbuild.cli`."""

from . import main

main()

"""``python -m wia_hw``: the ``wia-hw`` command line (as ``python -m wia_hw.cli``)."""

from .cli import main

main()

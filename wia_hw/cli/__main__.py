"""``python -m wia_hw.cli``: the ``wia-hw`` command line."""

from . import main

main()

"""``python -m placeverify``."""

from placeverify.cli import main

main()

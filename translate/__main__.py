"""`python -m translate ...` (used by torchrun: torchrun ... -m translate train --config CFG)."""

from translate.cli import main

main()

"""Print the run directory (RUN_DIR/NAME) of a config: `python scripts/run_dir.py configs/bible.yaml [key=value ...]`."""

import sys

from translate.config import load_config
from translate.errors import UserError, run_script


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        if len(sys.argv) < 2:
            raise UserError("give a config file")
        return
    print(load_config(sys.argv[1], sys.argv[2:]).run_path)


if __name__ == "__main__":
    run_script(main)

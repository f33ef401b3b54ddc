"""Print the run directory (RUN_DIR/NAME) of a config: `python scripts/run_dir.py configs/bible.yaml`."""

import sys

from translate.config import load_config

if __name__ == "__main__":
    print(load_config(sys.argv[1], sys.argv[2:]).run_path)

"""``python -m flowrl fit --config configs/quickstart.yaml``."""

from flowrl.cli import main

if __name__ == "__main__":
    main()

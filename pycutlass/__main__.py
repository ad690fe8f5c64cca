"""``python -m pycutlass``: the same command line as ``pycutlass``."""
from pycutlass.cli import main

if __name__ == "__main__":
    main(prog_name="pycutlass")

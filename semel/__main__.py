"""`python -m semel` runs the `semel` command."""
import sys

from semel.cli.main import main

sys.exit(main())

import sys

from optimize.cli import main

sys.exit(main())

import sys

from infinity.cli import main

sys.exit(main())

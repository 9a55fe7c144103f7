import sys

from mixdiag.cli import main

sys.exit(main())

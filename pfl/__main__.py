import sys

from pfl.cli import main

sys.exit(main())

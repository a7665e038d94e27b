import sys

from epctx.cli import main

sys.exit(main())

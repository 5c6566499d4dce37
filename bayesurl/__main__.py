import sys

from bayesurl.cli import main

sys.exit(main())

"""``python -m harness.cli ...``: the ``paritybench`` command, as it was before the CLI became a package."""

import sys

from harness.cli.main import main

sys.exit(main())

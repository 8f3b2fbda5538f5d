"""Run the slot task: `python -m seedkeeper_task`."""

import sys

from seedkeeper_task.launch import main

sys.exit(main())

import sys

from kiosk_agent.cli import main

sys.exit(main())

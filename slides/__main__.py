import sys

from slides.build import main

sys.exit(main())

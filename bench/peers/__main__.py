"""`python -m bench.peers`: run the peers harness."""

from .run import main

main()

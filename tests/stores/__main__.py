import sys

from tests.stores.registry import main

main(sys.argv[1:])

from msd.cli.main import main

main()

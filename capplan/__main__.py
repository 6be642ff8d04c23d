from capplan.cli import main

main()

from infertrace.cli import main

main()

"""`python -m infertrace`: the same as the `infertrace` command."""

from infertrace.cli import main

main()

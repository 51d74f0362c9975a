"""The ``fedjax-metric`` console command: one experiment, or a paper table.

  fedjax-metric --config=fedquad:runlocal --workdir=runs/x   # launch.main
  fedjax-metric reproduce fedrcl table1 --seeds=3            # launch.reproduce
  fedjax-metric scale --out=runs/scale                       # launch.scale

Each subcommand defines its own flags, so only the one asked for is
imported (launch.main's --config and --workdir are required flags).
``--help`` after a command shows that command's usage and flags.
"""

import sys

from . import cli


def main():
  if sys.argv[1:2] == ['scale']:
    from . import scale  # pylint: disable=g-import-not-at-top

    scale.run_main(
      [sys.argv[0], *sys.argv[2:]], flags_parser=cli.flags_parser(scale)
    )
    return
  if sys.argv[1:2] == ['reproduce']:
    from . import reproduce  # pylint: disable=g-import-not-at-top

    reproduce.run_main([sys.argv[0], *sys.argv[2:]])
    return
  from . import main as experiment  # pylint: disable=g-import-not-at-top

  experiment.run_main(epilog=experiment.SUBCOMMANDS)


if __name__ == '__main__':
  main()

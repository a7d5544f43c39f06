"""The `kfast` command line. Each subcommand is one parser builder and one runner; both stay thin and
call the library."""

import argparse
import json
import sys


def _add_doctor(subparsers):
    p = subparsers.add_parser(
        "doctor", help="report Python, TensorFlow, Keras, Horovod, NVML and GPUs, with fixes",
        description="Check this machine for kfast: versions, Horovod build, GPUs. Exits 1 if a required "
                    "piece is broken.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=_run_doctor)


def _run_doctor(args):
    from kfast import doctor

    report = doctor.collect()
    print(json.dumps(report, indent=2) if args.json else doctor.format_report(report))
    return 1 if doctor.has_errors(report) else 0


def build_parser():
    parser = argparse.ArgumentParser(prog="kfast", description="Fast input pipelines and Horovod scaling for Keras 3.")
    from kfast import __version__

    parser.add_argument("--version", action="version", version=f"kfast {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_doctor(subparsers)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

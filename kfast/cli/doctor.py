"""`kfast doctor`: check this machine (and optionally the hosts of a launch) for kfast."""

from __future__ import annotations

import argparse
import json


def add_doctor(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "doctor", help="report Python, TensorFlow, Keras, Horovod, NVML and GPUs, with fixes",
        description="Check this machine for kfast: versions, Horovod build, GPUs. Exits 1 if a required "
                    "piece is broken.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--hosts", metavar="HOST[,HOST...]",
                   help="also check these hosts for a multi-host launch, as `kfast launch` does before "
                        "starting the job (ssh, working directory, versions, hostnames, interfaces), for the engine "
                        "of Keras's backend (Horovod on TensorFlow, JAX's processes on JAX)")
    p.set_defaults(run=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from kfast.env import doctor

    if args.hosts:
        import sys

        from kfast.cli.launch import engine_for
        from kfast.cluster.hosts import parse_host_list

        try:
            found = parse_host_list(args.hosts, option="--hosts", slots_optional=True)
        except ValueError as e:
            print(f"kfast doctor: {e}", file=sys.stderr)
            return 2
        names = list(dict.fromkeys(host for host, _ in found.hosts))
    report = doctor.collect()
    if args.hosts:
        doctor.check_hosts(report, names, engine=engine_for(None))
    print(json.dumps(report, indent=2) if args.json else doctor.format_report(report))
    return 1 if doctor.has_errors(report) else 0

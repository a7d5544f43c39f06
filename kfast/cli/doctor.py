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

    report = doctor.collect()
    if args.hosts:
        from kfast.cli.launch import engine_for

        doctor.check_hosts(report, [h.rsplit(":", 1)[0] for h in args.hosts.split(",") if h], engine=engine_for(None))
    print(json.dumps(report, indent=2) if args.json else doctor.format_report(report))
    return 1 if doctor.has_errors(report) else 0

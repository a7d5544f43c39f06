"""`kfast plan`: the command line of `kfast.plan`."""

from __future__ import annotations

import argparse
import sys

from kfast.cli._common import load_target
from kfast.cli._common import show


def add(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "plan", help="predict scaling efficiency on N ranks and whether a training step fits a device",
        description="Measure the model returned by TARGET (a module:function taking no arguments and returning "
                    "a compiled model, or (model, dataset)) and predict step time, samples/s and scaling "
                    "efficiency on 1..N ranks for ring-allreduce and a parameter server, with what to change; "
                    "and one device's memory: parameters, gradients, optimizer state, activations and batch, "
                    "whether it fits, and the cheapest change that makes it fit.")
    p.add_argument("target", metavar="TARGET", help="module:function or path/to/file.py:function")
    link = p.add_mutually_exclusive_group()
    link.add_argument("--hosts", metavar="H1,H2",
                      help="measure latency and bandwidth between these two hosts with real allreduces (horovodrun)")
    link.add_argument("--bandwidth", metavar="RATE", help="link bandwidth, e.g. 10Gbit, 25Gbit/s, 1.25GB/s")
    p.add_argument("--latency", metavar="TIME", help="per-message latency, e.g. 20us, 1ms (with --bandwidth)")
    p.add_argument("--ranks", metavar="N[,N...]", help="rank counts to predict (default 1,2,4,...,1024)")
    p.add_argument("--compression", choices=["fp16"], help="exchange float32 gradients as float16")
    p.add_argument("--servers", type=int, default=1, help="parameter-server shards for the comparison (default 1)")
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch of synthetic inputs (default 32)")
    p.add_argument("--device-memory", metavar="SIZE",
                   help="one device's memory for the fit verdict, e.g. 80GB, 16GiB (default: the GPU's, via NVML)")
    p.add_argument("--device", metavar="GPU",
                   help="compile the step for this GPU without one here (H100, A100-80GB, ...; see "
                        "kfast.planning.known_gpus()) for XLA's memory per device, the runtime's margin and, when "
                        "it does not fit, the changes compiled; needs pip install 'kfast[plan-gpu]'")
    p.add_argument("--precision", choices=["float32", "mixed_float16", "mixed_bfloat16"],
                   help="predict memory for this dtype policy (default: the model's own)")
    p.add_argument("--plot", metavar="PNG", help="also write efficiency and throughput against ranks to PNG")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(run=run)


def _ranks(text: str) -> list[int]:
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        ranks = []
    if not ranks or min(ranks) < 1:
        raise ValueError(f"--ranks {text!r} is not a list of rank counts; expected e.g. 1,2,4,8.")
    return ranks


def run(args: argparse.Namespace) -> int:
    from kfast.planning import link_probe
    from kfast.planning import parse_memory
    from kfast.planning import GpuCompileUnavailable
    from kfast.planning import plan

    try:
        ranks = _ranks(args.ranks) if args.ranks else None
        if args.latency and not args.bandwidth:
            raise ValueError("--latency goes with --bandwidth; pass both, or --hosts to measure them.")
        if args.device_memory is not None:
            parse_memory(args.device_memory)
        if args.device is not None:
            from kfast.planning import gpu_spec

            gpu_spec(args.device)
        bandwidth, latency, source = args.bandwidth, args.latency, None
        if args.hosts:
            from kfast.cluster.hosts import parse_host_list

            hosts = [h for h, _ in parse_host_list(args.hosts, option="--hosts", slots_optional=True).hosts]
            print(f"measuring the link {hosts[0]} <-> {hosts[1] if len(hosts) > 1 else '?'} with real allreduces...",
                  file=sys.stderr, flush=True)
            latency, bandwidth, _ = link_probe.measure(hosts)
            source = f"measured between {hosts[0]} and {hosts[1]}"
    except (ValueError, RuntimeError) as e:
        print(f"kfast plan: {e}", file=sys.stderr)
        return 2
    built = load_target(args.target)()
    model, dataset = built if isinstance(built, tuple) else (built, None)
    try:
        result = plan(model, dataset, ranks=ranks, bandwidth=bandwidth, latency=latency,
                      compression=args.compression, servers=args.servers, batch_size=args.batch_size,
                      link_source=source, device_memory=args.device_memory, device=args.device, precision=args.precision)
    except (ValueError, GpuCompileUnavailable) as e:
        print(f"kfast plan: {e}", file=sys.stderr)
        return 2
    finally:
        if hasattr(dataset, "close"):
            dataset.close()
    return show(result, args)

"""The Zenoh flags every Python example takes, with the Rust and C examples' names:
--device, -m/--mode, -e/--connect, -l/--listen, -c/--config, --no-multicast-scouting."""

import os


def add_zenoh_flags(ap):
    """The flags every example shares (the Rust examples' names)."""
    ap.add_argument("--device", choices=["auto", "cuda", "host"], default="auto")
    ap.add_argument("-m", "--mode", choices=["peer", "client", "router"], help="Zenoh mode (default: peer)")
    ap.add_argument("-e", "--connect", action="append", default=[], help="Zenoh endpoint to connect to")
    ap.add_argument("-l", "--listen", action="append", default=[], help="Zenoh endpoint to listen on")
    ap.add_argument("-c", "--config", help="a Zenoh JSON5 configuration file (alone: not with -m, -e, -l)")
    ap.add_argument("--no-multicast-scouting", action="store_true")


def zenoh_config(ap, args):
    """What `zcs.open` takes for Zenoh: the -c file's path, or the flags as a dict. The
    library reads a file whole, so -c and the other Zenoh flags are not mixed."""
    if args.config:
        mixed = [f for f, v in (("-m", args.mode), ("-e", args.connect), ("-l", args.listen),
                                ("--no-multicast-scouting", args.no_multicast_scouting)) if v]
        if mixed:
            ap.error(f"-c/--config is read whole: put {', '.join(mixed)} in {args.config} instead")
        if not os.path.isfile(args.config):
            ap.error(f"-c/--config {args.config}: no such file")
        return args.config
    zenoh = {"mode": args.mode or "peer"}
    if args.connect:
        zenoh["connect"] = {"endpoints": args.connect}
    if args.listen:
        zenoh["listen"] = {"endpoints": args.listen}
    if args.no_multicast_scouting:
        zenoh["scouting"] = {"multicast": {"enabled": False}}
    return zenoh

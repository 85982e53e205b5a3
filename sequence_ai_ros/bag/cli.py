"""``sequence-ai bag ...``: export episode bags to LeRobot datasets, repair cut bags, show a bag.

    sequence-ai bag export BAG [BAG ...] --out DIR [--format lerobot] [--fps N]
                           [--version 3.0|2.1] [--append | --overwrite] [--robot-type NAME]
                           [--gr00t-modality]
    sequence-ai bag repair BAG [BAG ...]
    sequence-ai bag label BAG [BAG ...] (--success | --failure | --clear) [--notes TEXT]
    sequence-ai bag info BAG [BAG ...]

``sequence_ai.cli`` imports this module only when ``bag`` is asked for, so the client keeps its
httpx-only footprint. Needs the ``data`` extra (rosbags, pyarrow, av, simplejpeg) and the ROS
environment (``. scripts/env.sh``: messages are deserialized with rclpy).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub) -> None:
    """Add the ``bag`` command (with its subcommands) to an argparse subparsers object."""
    p = sub.add_parser("bag", help="export episode bags to LeRobot datasets; repair cut bags")
    bsub = p.add_subparsers(dest="bag_command", required=True)
    e = bsub.add_parser("export", help="bags -> a LeRobot dataset (one frame per control step)")
    e.add_argument("bags", nargs="+", type=Path, help="bag directories written by episode_recorder")
    e.add_argument("--out", required=True, type=Path, help="dataset directory")
    e.add_argument("--format", default="lerobot", choices=["lerobot"], help="dataset format (default lerobot)")
    e.add_argument("--fps", type=int, default=None,
                   help="frames per second (default: the commands' declared rate, else the one the recorder measured)")
    e.add_argument("--version", default="3.0", choices=["3.0", "2.1"], help="LeRobot format version (default 3.0)")
    e.add_argument("--robot-type", default=None, help="info.json robot_type, e.g. panda")
    e.add_argument("--gr00t-modality", action="store_true",
                   help="also write GR00T's meta/modality.json (state/action index ranges per body part, video "
                        "keys, the task annotation); needs --version 2.1")
    g = e.add_mutually_exclusive_group()
    g.add_argument("--append", action="store_true",
                   help="add the episodes to an earlier export of this tool at --out (it carries its marker)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export of this tool at --out (it carries its marker); any other "
                        "non-empty folder, /, your home and the working directory or above are refused")
    r = bsub.add_parser("repair", help="rewrite bags cut by a crash as complete bags (all complete chunks kept)")
    r.add_argument("bags", nargs="+", type=Path)
    lb = bsub.add_parser("label", help="set the success label of recorded episodes (-> next.success)")
    lb.add_argument("bags", nargs="+", type=Path)
    lg = lb.add_mutually_exclusive_group(required=True)
    lg.add_argument("--success", dest="success", action="store_const", const=True, help="the episode succeeded")
    lg.add_argument("--failure", dest="success", action="store_const", const=False, help="the episode failed")
    lg.add_argument("--clear", dest="clear", action="store_true", help="back to unlabeled")
    lb.add_argument("--notes", default="", help="free text kept with the label")
    i = bsub.add_parser("info", help="episode markers and message counts of bags")
    i.add_argument("bags", nargs="+", type=Path)


def _warn_if_cut(episodes):
    """Pass ``EpisodeFrames`` through, warning on stderr for each one whose bag had no end
    marker: it is exported (recovering such a bag is the point), but the user should know; and
    for what its timing report warns of (a stream whose receipt times disagree with its declared
    rate, stamps that could not be used, a rate measured for want of a declared one)."""
    for ep in episodes:
        if ep.cut:
            print(f"warning: {ep.source} has no end marker (the recording was cut, e.g. by a crash): exported "
                  "what was recovered, but its last chunk may be missing and it has no outcome", file=sys.stderr)
        for text in (ep.timing or {}).get("warnings", []):
            print(f"warning: {ep.source}: {text}", file=sys.stderr)
        yield ep


def run(args) -> int:
    """Run a parsed ``bag`` command; returns the exit code (0 ok, 1 a typed error or a missing
    library: one line naming the extra, or the ROS 2 set-up, as every console script says it:
    :func:`sequence_ai.extras.guarded`)."""
    from sequence_ai.extras import guarded
    return guarded(lambda: lambda: _run(args), "sequence-ai bag", "data")


def _run(args) -> int:
    from sequence_ai_data.episode import ExportError
    from sequence_ai_data.lerobot import write_export

    from .frames import frames_from_bag
    from .reader import BagReadError, label_bag, read_episode, repair_bag
    try:
        if args.bag_command == "export":
            mode = "append" if args.append else "overwrite" if args.overwrite else "new"
            for bag in args.bags:
                if not bag.exists():
                    raise BagReadError(f"{bag} does not exist")
            episodes = _warn_if_cut(frames_from_bag(b, fps=args.fps) for b in args.bags)
            summary = write_export(episodes, args.out, version=args.version, mode=mode, robot_type=args.robot_type,
                                   gr00t_modality=args.gr00t_modality)
            print(f"wrote {summary['out']} (LeRobot v{summary['version']}): +{summary['added_episodes']} episodes, "
                  f"+{summary['added_frames']} frames; now {summary['episodes']} episodes, {summary['frames']} frames, "
                  f"{summary['tasks']} tasks")
        elif args.bag_command == "repair":
            for bag in args.bags:
                rep = repair_bag(bag)
                if rep["repaired"]:
                    print(f"repaired {rep['bag']}: {rep['messages']} messages kept "
                          f"({rep['kept_bytes']} of {rep['total_bytes']} bytes)")
                else:
                    print(f"ok       {rep['bag']}: complete, nothing to do")
        elif args.bag_command == "label":
            success = None if args.clear else args.success
            for bag in args.bags:
                rep = label_bag(bag, success, args.notes)
                print(f"labeled  {rep['bag']}: success={success}")
        elif args.bag_command == "info":
            for bag in args.bags:
                rec = read_episode(bag)
                print(f"{bag}: task {rec.task!r}; "
                      + ", ".join(f"{v} {len(m)} frames" for v, m in rec.images.items())
                      + f", {len(rec.joints)} joint states, {len(rec.commands)} commands; "
                      + (f"end {rec.end.get('outcome')}, label {rec.success}" if rec.end else "no end marker (cut)"))
                print("  times: " + ", ".join(f"{t} {s}" for t, s in sorted(rec.time_sources.items()))
                      + f"; declared control rate {rec.start.get('control_frequency_hz') or 'none'}")
                rates, origins = rec.start.get("stream_rates_hz") or {}, rec.start.get("stream_rate_sources") or {}
                print("  rates: " + (", ".join(f"{t} {hz:g} Hz ({origins.get(t, 'declared')})"
                                               for t, hz in sorted(rates.items())) or "none declared"))
        return 0
    except (ExportError, BagReadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(argv=None) -> int:
    """Stand-alone entry (``python -m sequence_ai_ros.bag.cli export ...``)."""
    parser = argparse.ArgumentParser(prog="sequence-ai")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    return run(parser.parse_args(["bag", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())

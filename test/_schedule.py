"""The order the suite's files run in and the markers their tests carry (test/conftest.py applies both).

Order. scripts/test.sh runs four pytest-xdist workers with ``--dist loadfile``: a worker takes the
next whole file from the queue when its current one is down to two tests. The queue is the
collection order (given ``--no-loadscope-reorder``; by default xdist re-sorts it by number of
tests, which put the 108 s ``test_ros_workspace.py`` with its 3 tests near the end). Files go
heaviest first (longest processing time first), so the light ones fill in at the end instead of
one heavy file keeping a worker busy while the other has nothing left. ``FILE_SECONDS`` holds
what each file took; a file not in it counts ``DEFAULT_SECONDS``.

Markers, from the file's folder (test/unit, server, client, ros, e2e) and what it imports. ``ros``:
a file in ros/, or one that imports ROS 2 (rclpy, launch, the interfaces, sequence_ai_ros, the
driver tests' helpers in _ros_driver_support.py) or is named ``test_ros_*`` (some start ROS nodes
as processes). ``e2e``: a file in e2e/, the whole stack as a user runs it. ``slow``: the e2e
files, ``SLOW`` and every file of ``SLOW_S`` seconds or more. ``bash scripts/test.sh --fast``
runs ``-m "not ros and not slow"``.

Refresh the table from a full run (scripts/test.sh writes build/test-results.xml):

    python test/_schedule.py build/test-results.xml
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

# Seconds per file (setup + call + teardown of all its tests), from the JUnit report of a full
# four-worker run from a clean clone (1,299 tests in 458 s wall), scaled by 0.81 to the same code's
# two-worker run (each file's time stretches with the load it runs under; what matters here is
# their order, and SLOW_S keeps its meaning), printed by `python test/_schedule.py REPORT.xml`.
FILE_SECONDS = {
    "test_ros_workspace.py": 98, "test_worker_fuzz.py": 79, "test_ray_backend.py": 64,
    "test_platform_ops.py": 58, "test_demo_end_to_end.py": 49, "test_gateway_restart.py": 46,
    "test_ros_launch.py": 36, "test_ros_driver.py": 33, "test_gateway.py": 32,
    "test_capture_recording.py": 30, "test_wheel_install.py": 30, "test_demo_cli.py": 28,
    "test_flywheel.py": 28, "test_ros_driver_lifecycle.py": 28, "test_mcp_server.py": 27,
    "test_platform_access.py": 27, "test_worker.py": 25, "test_platform_versions.py": 24,
    "test_hardening.py": 23, "test_client_promises.py": 22, "test_layering.py": 20,
    "test_platform_params_slots.py": 20, "test_bag_stamps.py": 19, "test_blocking_channel_faults.py": 19,
    "test_ros_node_signals.py": 19, "test_bag_export_paths.py": 18, "test_fleet_workers.py": 18,
    "test_platform_traffic.py": 18, "test_platform_images.py": 17, "test_ros_services.py": 17,
    "test_adapters.py": 16, "test_health_frozen_processes.py": 16, "test_ops_hardening.py": 16,
    "test_act_channel.py": 15, "test_core_client.py": 15, "test_core_wire.py": 15,
    "test_eval_pick_place.py": 15, "test_mcp_tasks.py": 15, "test_platform_volumes.py": 15,
    "test_recipes.py": 15, "test_worker_auth.py": 15, "test_client_queue.py": 14, "test_core_loop.py": 14,
    "test_route_scopes.py": 14, "test_delay_wire.py": 13, "test_act_channel_limits.py": 12,
    "test_capture_server.py": 12, "test_client_transports.py": 12, "test_eval_learned.py": 12,
    "test_ros_driver_controllers.py": 12, "test_header_timeout.py": 11, "test_core_properties.py": 9,
    "test_limits_seams.py": 9, "test_forked_workers.py": 22, "test_cards.py": 8, "test_ros_trajectory_output.py": 8, "test_launch.py": 7,
    "test_platform_health.py": 7, "test_platform_secrets.py": 7, "test_admission.py": 6,
    "test_admission_server.py": 6, "test_channel_hardening.py": 6, "test_core_interrupt.py": 6,
    "test_export_paths.py": 6, "test_mcp_ros.py": 6, "test_mcp_stop_when.py": 6,
    "test_pick_place_closed_loop.py": 6, "test_platform_logs.py": 6, "test_ros_operator.py": 6,
    "test_frame_size.py": 5, "test_chat_decide.py": 4, "test_health_frozen.py": 4,
    "test_openpi_compat.py": 4, "test_refused_bodies.py": 4, "test_seq_cli_package.py": 3,
    "test_worker_deadlines.py": 3, "test_act_same_host.py": 2, "test_act_transports.py": 2,
    "test_authoring.py": 2, "test_capture_units.py": 2, "test_core_delay.py": 2, "test_core_stop.py": 2,
    "test_docs.py": 2, "test_gateway_services.py": 2, "test_node_executor.py": 2,
    "test_openpi_hardening.py": 2, "test_sim.py": 2, "test_state_db.py": 2, "test_volume_eval_paths.py": 2,
    "test_worker_body_limit.py": 2, "test_core_clock.py": 1, "test_core_deadline.py": 1,
    "test_core_lookahead.py": 1, "test_core_loop_logic.py": 1, "test_core_obs_to_action.py": 1,
    "test_core_refill.py": 1, "test_core_stop_when.py": 1, "test_core_units.py": 1,
    "test_driver_units.py": 1, "test_eval_benchmark.py": 1, "test_export_target_units.py": 1,
    "test_gate_gil_lead.py": 1, "test_interfaces.py": 1, "test_protocol.py": 1,
    "test_recorder_label_paths.py": 1, "test_recorder_post_roll.py": 1, "test_recorder_prune_paths.py": 1,
    "test_recorder_rates.py": 1, "test_ros_launch_config.py": 1, "test_schedule.py": 1,
    "test_seq_cli_helper.py": 1, "test_server_config.py": 1, "test_slot_queue.py": 1, "test_spin_destroy_race.py": 1,
    "test_wait.py": 1,
    "test_worker_inline.py": 1, "test_worker_schedule.py": 1,
}
DEFAULT_SECONDS = 10          # a new file: mid-queue until it is measured

SLOW = {"test_ray_backend.py"}
SLOW_S = 20

_ROS_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:rclpy|launch|launch_ros|launch_pytest|sequence_ai_msgs|"
                         r"sequence_ai_ros|_ros_driver_support|_bags|std_msgs|std_srvs|sensor_msgs|action_msgs|"
                         r"builtin_interfaces|trajectory_msgs)\b", re.M)


def seconds(name: str) -> float:
    return FILE_SECONDS.get(name, DEFAULT_SECONDS)


def markers(path: Path) -> list[str]:
    """The markers every test of the file at ``path`` gets."""
    name = path.name
    found = []
    folder = path.parent.name
    if folder == "ros" or name.startswith("test_ros_") or _ROS_IMPORT.search(path.read_text(errors="replace")):
        found.append("ros")
    if folder == "e2e":
        found.append("e2e")
    if folder == "e2e" or name in SLOW or seconds(name) >= SLOW_S:
        found.append("slow")
    return found


def apply(items: list) -> None:
    """Mark ``items`` (pytest's collected list) by file and put the heaviest files first, in place;
    a file's tests keep their order, files of equal weight their collection order."""
    first: dict[Path, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.path, i)
    marks = {path: markers(path) for path in first}
    for item in items:
        for m in marks[item.path]:
            item.add_marker(m)
    items.sort(key=lambda item: (-seconds(item.path.name), first[item.path]))


def table_from_junit(xml_path: str) -> dict[str, int]:
    """Seconds per test file from a pytest JUnit XML report (each case's time is setup + call + teardown)."""
    import xml.etree.ElementTree as ET
    totals: dict[str, float] = {}
    for case in ET.parse(xml_path).iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((m for m in module if m.startswith("test_")), None)
        if name:
            totals[name + ".py"] = totals.get(name + ".py", 0.0) + float(case.get("time") or 0)
    return {name: max(1, round(s)) for name, s in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))}


def _print_table(table: dict[str, int]) -> None:
    line, out = "    ", []
    for name, s in table.items():
        entry = f'"{name}": {s}, '
        if len(line) + len(entry) > 110:
            out.append(line.rstrip())
            line = "    "
        line += entry
    out.append(line.rstrip())
    print("FILE_SECONDS = {\n" + "\n".join(out) + "\n}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python test/_schedule.py REPORT.xml   (a pytest --junitxml report of a full run)")
    _print_table(table_from_junit(sys.argv[1]))

"""Launch the simulated Franka cell and the policy driver together, optionally namespaced.

    ros2 launch sequence_ai sim.launch.py namespace:=sim model:=pick-place seed:=3 record:=true

Arguments: ``namespace``, ``model`` (empty = the config's), ``config`` (default
``panda_sim.yaml``, a name in the package's ``config/`` or an absolute path), ``seed``,
``record`` (``true`` also starts ``episode_recorder``: one bag per Act goal), ``record_dir``.
Start ``seq serve`` and ``seq deploy`` first and export the API key.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from sequence_ai_ros.launch_support import config_file, driver_and_recorder, stop_nodes_on_sigterm


def _nodes(context):
    config = config_file(context)
    sim = Node(package="sequence_ai", executable="sim_robot", name="sim_robot", namespace=LaunchConfiguration("namespace"),
               parameters=[config, {"seed": int(LaunchConfiguration("seed").perform(context))}], output="screen")
    return [sim, *driver_and_recorder(context, config)]


def generate_launch_description():
    return LaunchDescription([
        stop_nodes_on_sigterm(),   # SIGTERM to ros2 launch stops the nodes as Ctrl-C does, then returns
        DeclareLaunchArgument("namespace", default_value="", description="Namespace of the cell and the driver."),
        DeclareLaunchArgument("model", default_value="", description="Deployment name; empty = the config file's."),
        DeclareLaunchArgument("config", default_value="panda_sim.yaml",
                              description="Parameter file: a name in the package's config/ or an absolute path."),
        DeclareLaunchArgument("seed", default_value="0", description="Scene seed for the simulated cell."),
        DeclareLaunchArgument("record", default_value="false",
                              description="true: also run episode_recorder (one bag per Act goal)."),
        DeclareLaunchArgument("record_dir", default_value="bags", description="Folder for the recorder's bags."),
        OpaqueFunction(function=_nodes),
    ])

"""Launch the policy driver for a real robot.

    ros2 launch sequence_ai driver.launch.py config:=franka_droid.yaml model:=pi05-droid namespace:=arm

Arguments: ``namespace`` (the driver, its topics, services and the Act action move under it;
the config file's ``/**:`` keys apply there too), ``model`` (deployment name; empty = the config
file's), ``config`` (a file in the package's ``config/`` or an absolute path), ``record``
(``true`` also starts ``episode_recorder`` in the same namespace, reading the same config: one
bag per Act goal), ``record_dir`` (where the bags go). The API key is read from the variable the
config names (``api_key_env``, default SEQUENCES_API_KEY): export it before launching.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction

from sequence_ai_ros.launch_support import config_file, driver_and_recorder, stop_nodes_on_sigterm


def _nodes(context):
    return driver_and_recorder(context, config_file(context))


def generate_launch_description():
    return LaunchDescription([
        stop_nodes_on_sigterm(),   # SIGTERM to ros2 launch stops the nodes as Ctrl-C does, then returns
        DeclareLaunchArgument("namespace", default_value="", description="Namespace of the driver and its robot topics."),
        DeclareLaunchArgument("model", default_value="", description="Deployment name; empty = the config file's."),
        DeclareLaunchArgument("config", default_value="franka_droid.yaml",
                              description="Parameter file: a name in the package's config/ or an absolute path."),
        DeclareLaunchArgument("record", default_value="false",
                              description="true: also run episode_recorder (one bag per Act goal)."),
        DeclareLaunchArgument("record_dir", default_value="bags", description="Folder for the recorder's bags."),
        OpaqueFunction(function=_nodes),
    ])

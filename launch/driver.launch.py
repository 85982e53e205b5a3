"""Launch the policy driver for a real robot.

    ros2 launch sequence_ai driver.launch.py config:=franka_droid.yaml model:=pi05-droid namespace:=arm

Arguments: ``namespace`` (the driver, its topics, services and the Act action move under it;
the config file's ``/**:`` keys apply there too), ``model`` (deployment name; empty = the config
file's), ``config`` (a file in the package's ``config/`` or an absolute path), ``record``
(``true`` also starts ``episode_recorder`` in the same namespace, reading the same config: one
bag per Act goal), ``record_dir`` (where the bags go). The API key is read from the variable the
config names (``api_key_env``, default SEQUENCES_API_KEY): export it before launching.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from sequence_ai_ros.launch_support import stop_nodes_on_sigterm


def _config_path(context) -> str:
    config = LaunchConfiguration("config").perform(context)
    if not os.path.isabs(config):
        config = os.path.join(get_package_share_directory("sequence_ai"), "config", config)
    if not os.path.isfile(config):
        raise FileNotFoundError(f"config:={config} does not exist; give a file in the sequence_ai package's "
                                f"config/ folder or an absolute path")
    return config


def _nodes(context):
    config = _config_path(context)
    namespace = LaunchConfiguration("namespace")
    params = [config]
    model = LaunchConfiguration("model").perform(context)
    if model:
        params.append({"model": model})
    return [
        Node(package="sequence_ai", executable="policy_driver", name="policy_driver",
             namespace=namespace, parameters=params, output="screen"),
        Node(package="sequence_ai", executable="episode_recorder", name="episode_recorder", namespace=namespace,
             parameters=[config, {"auto_record": True, "output_dir": LaunchConfiguration("record_dir")}],
             output="screen", condition=IfCondition(LaunchConfiguration("record"))),
    ]


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

"""Launch the policy driver for a real robot (a real ROS 2 install).

    ros2 launch sequence_ai driver.launch.py config:=franka_droid.yaml model:=pi05-droid namespace:=arm

Arguments: ``namespace`` (all topics, services and the Act action move under it),
``model`` (deployment name, overrides the param file), ``config`` (a file in the package's
``config/`` or an absolute path). The API key is read from the variable the config names
(``api_key_env``, default SEQUENCES_API_KEY): export it before launching.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def _driver(context):
    config = LaunchConfiguration("config").perform(context)
    if not os.path.isabs(config):
        config = os.path.join(get_package_share_directory("sequence_ai"), "config", config)
    params = [config]
    model = LaunchConfiguration("model").perform(context)
    if model:
        params.append({"model": model})
    return [Node(package="sequence_ai", executable="policy_driver", name="policy_driver",
                 namespace=LaunchConfiguration("namespace"), parameters=params, output="screen")]


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value="", description="Namespace of the driver and its robot topics."),
        DeclareLaunchArgument("model", default_value="", description="Deployment name; empty = the config file's."),
        DeclareLaunchArgument("config", default_value="franka_droid.yaml",
                              description="Parameter file: a name in the package's config/ or an absolute path."),
        OpaqueFunction(function=_driver),
    ])

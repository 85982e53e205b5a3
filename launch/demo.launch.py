"""Launch the simulated Franka cell and the policy driver (the demo's nodes) with panda_sim.yaml.

    ros2 launch sequence_ai demo.launch.py seed:=3 record:=true
    ros2 action send_goal /policy_driver/act sequence_ai_msgs/action/Act \
        "{instruction: 'put the red cube on the green pad', max_seconds: 45.0}"

Start the local server and deploy the policy first (``seq serve`` and
``seq deploy examples/pick_place/policy.py --name pick-place``) and export SEQUENCES_API_KEY
(and SEQUENCES_GATEWAY_URL when the gateway is not on 127.0.0.1:8470).

Arguments: ``seed`` (scene seed), ``record`` (``true`` also starts ``episode_recorder``, which
writes one rosbag2 bag per Act goal), ``record_dir`` (where the bags go; relative = from the
working directory of ``ros2 launch``).
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from sequence_ai_ros.launch_support import stop_nodes_on_sigterm


def generate_launch_description():
    config = os.path.join(get_package_share_directory("sequence_ai"), "config", "panda_sim.yaml")
    return LaunchDescription([
        stop_nodes_on_sigterm(),   # SIGTERM to ros2 launch stops the nodes as Ctrl-C does, then returns
        DeclareLaunchArgument("seed", default_value="0", description="Scene seed for the simulated cell."),
        DeclareLaunchArgument("record", default_value="false",
                              description="true: also run episode_recorder (one bag per Act goal)."),
        DeclareLaunchArgument("record_dir", default_value="bags", description="Folder for the recorder's bags."),
        Node(package="sequence_ai", executable="sim_robot", name="sim_robot",
             parameters=[config, {"seed": LaunchConfiguration("seed")}], output="screen"),
        Node(package="sequence_ai", executable="policy_driver", name="policy_driver",
             parameters=[config], output="screen"),
        Node(package="sequence_ai", executable="episode_recorder", name="episode_recorder",
             parameters=[config, {"auto_record": True, "output_dir": LaunchConfiguration("record_dir")}],
             output="screen", condition=IfCondition(LaunchConfiguration("record"))),
    ])

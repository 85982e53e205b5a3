"""Launch the simulated Franka cell and the policy driver (a real ROS 2 install).

    ros2 launch sequence_ai demo.launch.py seed:=3
    ros2 action send_goal /policy_driver/act sequence_ai_msgs/action/Act \
        "{instruction: 'put the red cube on the green pad', max_seconds: 45.0}"

Start the local server and deploy the policy first (``seq serve`` and
``seq deploy examples/pick_place/policy.py --name pick-place``) and export SEQUENCES_API_KEY.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def generate_launch_description():
    config = os.path.join(get_package_share_directory("sequence_ai"), "config", "panda_sim.yaml")
    seed = LaunchConfiguration("seed")
    return LaunchDescription([
        DeclareLaunchArgument("seed", default_value="0", description="Scene seed for the simulated cell."),
        Node(package="sequence_ai", executable="sim_robot", name="sim_robot",
             parameters=[config, {"seed": seed}], output="screen"),
        Node(package="sequence_ai", executable="policy_driver", name="policy_driver",
             parameters=[config], output="screen"),
    ])

"""``_spin.destroy_node``: a node with an action client leaves the ROS graph when it is destroyed,
not whenever a later garbage collection frees its action client (rclpy's ``destroy_node`` leaves
action servers and clients alive, and they keep the rcl node -- and the context's DDS participant --
alive with them). Real rclpy over Fast DDS, two contexts in this process."""
from __future__ import annotations

import gc

import pytest
import rclpy
from rclpy.action import ActionClient

from _wait import eventually
from sequence_ai_msgs.action import Act
from sequence_ai_ros._spin import destroy_node


@pytest.fixture
def observer():
    ctx = rclpy.context.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("teardown_observer", context=ctx)
    try:
        yield node
    finally:
        destroy_node(node)
        rclpy.shutdown(context=ctx)


def _node_with_an_action_client(name: str):
    ctx = rclpy.context.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node(name, context=ctx)
    client = ActionClient(node, Act, "policy_driver/act")
    return ctx, node, client


def _in_graph(observer, name: str) -> bool:
    return name in observer.get_node_names()


@pytest.mark.parametrize("how", ["destroy_node helper", "rclpy destroy_node"])
def test_a_destroyed_node_leaves_the_graph_only_when_its_action_client_goes_too(observer, how):
    name = "teardown_" + how.split()[0]
    ctx, node, client = _node_with_an_action_client(name)
    gc_was = gc.isenabled()
    gc.disable()          # the rclpy case must not be rescued by a collection during the wait
    try:
        eventually(lambda: _in_graph(observer, name), 20.0, 0.05, what=f"{name} in the graph")
        if how == "destroy_node helper":
            destroy_node(node)
            eventually(lambda: not _in_graph(observer, name), 20.0, 0.05, what=f"{name} gone from the graph")
        else:
            node.destroy_node()               # the action client (held here) keeps the rcl node alive
            with pytest.raises(AssertionError):
                eventually(lambda: not _in_graph(observer, name), 2.0, 0.05, what=f"{name} gone from the graph")
            client.destroy()                  # what the helper adds
            eventually(lambda: not _in_graph(observer, name), 20.0, 0.05, what=f"{name} gone from the graph")
    finally:
        if gc_was:
            gc.enable()
        rclpy.shutdown(context=ctx)

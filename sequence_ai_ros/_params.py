"""Declaring a node's parameters from one ``{name: (default, description)}`` table.

A YAML file or ``-p`` that writes a float parameter as an integer (``publish_delay_ms: 2``)
is the classic ROS 2 pitfall: rclpy refuses it with a type error that does not name the fix.
Float parameters are therefore declared with dynamic typing and read back as floats; anything
that is not a number is refused with a ``ValueError`` naming the parameter and what it takes.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import ParameterUninitializedException
from rclpy.node import Node

__all__ = ["declare_parameters"]


def declare_parameters(node: Node, table: Dict[str, Tuple[Any, str]]) -> Dict[str, Any]:
    """Declare every ``name: (default or rclpy Parameter.Type, description)`` on ``node`` and
    return ``{name: value}``: floats as ``float`` (an integer given for one is accepted), a typed
    array left unset as ``None``.

    Raises:
        ValueError: a float parameter was given something that is not a number (names it).
    """
    values: Dict[str, Any] = {}
    for name, (default, description) in table.items():
        number = isinstance(default, float)
        node.declare_parameter(name, default, ParameterDescriptor(description=description, dynamic_typing=number))
        try:
            value = node.get_parameter(name).value
        except ParameterUninitializedException:
            value = None
        if number:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"parameter {name} takes a number ({description}), got {value!r}")
            value = float(value)
        values[name] = value
    return values

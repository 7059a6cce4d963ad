"""Registers every built-in rollout mode in :data:`~stepcredit.rollout.modes.ROLLOUT_MODES` (one line
per mode; ``import stepcredit.rollout`` runs this module, so the package alone has every mode)."""

from stepcredit.rollout.flat_mode import flat_rollout
from stepcredit.rollout.modes import ROLLOUT_MODES, RolloutModeSpec
from stepcredit.rollout.tool_mode import check_tools, tools_rollout
from stepcredit.rollout.tool_tree_mode import check_tool_tree, tool_tree_rollout
from stepcredit.rollout.tree_mode import tree_rollout

ROLLOUT_MODES.add("flat", RolloutModeSpec(flat_rollout, shares_prefixes=False))
ROLLOUT_MODES.add("tree", RolloutModeSpec(tree_rollout, shares_prefixes=True))
ROLLOUT_MODES.add(
    "tools", RolloutModeSpec(tools_rollout, shares_prefixes=False, check=check_tools, uses_tools=True)
)
ROLLOUT_MODES.add(
    "tools_tree",
    RolloutModeSpec(tool_tree_rollout, shares_prefixes=True, check=check_tool_tree, uses_tools=True),
)

"""Settings declared once: one dataclass per concern, each field with its
default, help text and flag (`setting`).

``hmgraph train``'s `TrainConfig` and ``hmgraph classify``'s
`ClassifyConfig` are unions of the concerns; every command's flags are
derived from the same fields (`add_arguments`, `from_args`).
"""

from hmgraph.settings.fields import (
    add_arguments,
    cli_names,
    default_of,
    flag_of,
    from_args,
    help_of,
    same_as,
    setting,
)
from hmgraph.settings.graphs import (
    SELECTIONS,
    SMOOTH_CV,
    ClassifyConfig,
    GraphModelSettings,
    GraphRunSettings,
    GraphTrainingSettings,
    ProtocolSettings,
)
from hmgraph.settings.nodes import (
    SHARE_BUDGETS,
    TRAIN_CONCERNS,
    WORKLOAD,
    CacheSettings,
    ModelSettings,
    RunSettings,
    SamplingSettings,
    StorageSettings,
    TrainConfig,
    cache_policies,
)

__all__ = [
    "SELECTIONS",
    "SHARE_BUDGETS",
    "SMOOTH_CV",
    "TRAIN_CONCERNS",
    "WORKLOAD",
    "CacheSettings",
    "ClassifyConfig",
    "GraphModelSettings",
    "GraphRunSettings",
    "GraphTrainingSettings",
    "ModelSettings",
    "ProtocolSettings",
    "RunSettings",
    "SamplingSettings",
    "StorageSettings",
    "TrainConfig",
    "add_arguments",
    "cache_policies",
    "cli_names",
    "default_of",
    "flag_of",
    "from_args",
    "help_of",
    "same_as",
    "setting",
]

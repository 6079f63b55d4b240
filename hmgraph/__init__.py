"""hmgraph: GNN training on graphs whose node features outgrow fast memory.

Built on DGL. The front door: datasets, the DGL-compatible `DataLoader`,
training, models and the ``hmgraph`` command line.

The top level imports lazily (PEP 562): ``import hmgraph`` loads neither
torch nor DGL, and ``import hmgraph.cache`` loads only the cache and
sets no environment variable. `DataLoader`, `LoaderStats` and
`MiniBatch` are imported from `hmgraph.loader` on first use, after
`hmgraph.openmp` has set OpenMP's wait policy.
"""

__all__ = ["DataLoader", "LoaderStats", "MiniBatch", "__version__"]

__version__ = "0.1.0"

# The public names that live in hmgraph.loader, imported on first access.
_FROM_LOADER = frozenset({"DataLoader", "LoaderStats", "MiniBatch"})


def __getattr__(name: str):
    """Import ``name`` from `hmgraph.loader` on first access (PEP 562).

    Raises
    ------
    AttributeError
        ``name`` is not one of the lazily imported public names.
    """
    if name not in _FROM_LOADER:
        raise AttributeError(f"module 'hmgraph' has no attribute {name!r}")
    # Lazy on purpose: the loader brings in torch and DGL, which
    # `import hmgraph.cache` must not; hmgraph.openmp comes first so that
    # OMP_WAIT_POLICY is set before torch loads.
    import hmgraph.openmp  # noqa: F401
    from hmgraph import loader

    value = getattr(loader, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily imported ones included."""
    return sorted(set(globals()) | set(__all__))

from linalg.matrix import Matrix

__all__ = ["Matrix"]

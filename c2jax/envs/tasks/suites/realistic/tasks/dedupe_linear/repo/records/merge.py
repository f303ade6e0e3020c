import itertools

from records.dedupe import dedupe


def merge_sources(*sources):
    """All records of all sources, in order, without repeats."""
    return dedupe(itertools.chain(*sources))

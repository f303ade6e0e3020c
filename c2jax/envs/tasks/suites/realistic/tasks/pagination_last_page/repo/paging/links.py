def page_links(paginator, current, window=2):
    """Page numbers to show around `current`: first, last, and `window` pages on each side."""
    last = paginator.num_pages
    shown = {1, last} | set(range(current - window, current + window + 1))
    return sorted(p for p in shown if 1 <= p <= last)

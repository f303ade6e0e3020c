from slugs.slugify import slugify


def unique_slug(text, existing):
    """slugify(text), with -2, -3, ... appended until it is not in `existing`."""
    base = slugify(text)
    slug, n = base, 1
    while slug in existing:
        n += 1
        slug = f"{base}-{n}"
    return slug
